"""replaysafe for agent loops written by hand on the OpenAI or Anthropic Python SDK.

One module per SDK, each importing only its own: ``replaysafe_sdk_loops.openai`` (Chat
Completions and Responses) and ``replaysafe_sdk_loops.anthropic`` (Messages). Both offer
``run_tool_calls``, ``arun_tool_calls`` and ``tool_calls``; this package imports neither SDK.
"""
