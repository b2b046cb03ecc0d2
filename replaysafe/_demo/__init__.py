"""``replaysafe demo``: the stories the command tells, each run in real agent processes that are SIGKILLed.

``double_refund``: a finished call, replayed after a crash (``replaysafe demo``). ``in_doubt``: a crash while
the refund is in flight, under each in-doubt policy (``replaysafe demo --in-doubt``). ``provider``: the local
payment provider the in-doubt story refunds through.
"""
