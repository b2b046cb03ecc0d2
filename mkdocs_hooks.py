"""mkdocs hooks (mkdocs.yml): an adapter's README keeps working links on its page of the site.

docs/integrations/<name>.md is one line, ``--8<-- "integrations/<name>/README.md"`` (pymdownx.snippets): the
README is the page. Its links are written for the repository (``../../README.md``, ``../../docs/operations.md``),
where GitHub follows them; on the site they would lead out of it. A link to a file that the site holds as a page
is made a link to that page: the README to the home page (docs/index.md), ``docs/<path>`` to ``<path>``, an
adapter's README to its page. Any other link is left as written, and ``mkdocs build --strict`` refuses it.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlsplit, urlunsplit
from xml.etree.ElementTree import Element

from markdown import Extension, Markdown
from markdown.treeprocessors import Treeprocessor
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

INCLUDE = re.compile(r'\s*--8<--\s+"(?P<readme>integrations/[^/"]+/README\.md)"\s*')
ADAPTER_README = re.compile(r"integrations/(?P<name>[^/]+)/README\.md")


class Rendering:
    """The page being rendered (pages render one at a time): its file, and the README it is, if it is one."""

    page = ""
    readme: str | None = None


def site_page(path: str) -> str | None:
    """The documentation file (a path under docs/) that stands for a file of the repository, if one does."""
    if path == "README.md":
        return "index.md"
    if path.startswith("docs/"):
        return path.removeprefix("docs/")
    if match := ADAPTER_README.fullmatch(path):
        return f"integrations/{match['name']}.md"
    return None


def site_link(link: str, readme: str, page: str) -> str:
    """``link`` as written in ``readme`` (a repository path), as a link of ``page`` (a path under docs/)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return link
    target = site_page(posixpath.normpath(posixpath.join(posixpath.dirname(readme), parts.path)))
    if target is None:
        return link
    path = posixpath.relpath(target, posixpath.dirname(page) or ".")
    return urlunsplit(("", "", path, parts.query, parts.fragment))


class RepositoryLinks(Treeprocessor):
    """Rewrites the links of a README page (``site_link``), before mkdocs resolves and checks them."""

    def run(self, root: Element) -> None:
        readme = Rendering.readme
        if readme is None:
            return
        for element in root.iter():
            attribute = {"a": "href", "img": "src"}.get(element.tag)
            value = element.get(attribute) if attribute else None
            if attribute and value is not None:
                element.set(attribute, site_link(value, readme, Rendering.page))


class RepositoryLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's name)
        # After the inline links are made (priority 20), before mkdocs's own link processor (0).
        md.treeprocessors.register(RepositoryLinks(md), "replaysafe_repository_links", 2)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.markdown_extensions.append(RepositoryLinksExtension())
    return config


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    match = INCLUDE.fullmatch(markdown)
    Rendering.page, Rendering.readme = page.file.src_uri, match["readme"] if match else None
    return markdown
