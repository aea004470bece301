"""Every relative link in README.md and docs/*.md points at a file or folder that exists,
resolved from the folder of the page that holds it (as GitHub resolves it)."""
import re

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ")" (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(text: str) -> list[str]:
  """Link targets that name a path in the repository: not a URL, not a mail address, not a
  same-page anchor; any #anchor dropped."""
  text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks hold no links
  targets = [match.group(1) for match in LINK.finditer(text)]
  return [t.split("#", 1)[0] for t in targets
          if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.IGNORECASE) and not t.startswith("#")]


def test_the_link_pattern_finds_relative_links_and_leaves_urls():
  text = ("See [a](docs/A.md#part), ![b](attention_cross.png \"title\"), [c](https://x.org/y), "
          "[d](#anchor), [e](mailto:a@b.c).\n```\n[f](in_code.md)\n```")
  assert relative_links(text) == ["docs/A.md", "attention_cross.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
  broken = [target for target in relative_links(page.read_text(encoding="utf-8"))
            if not (page.parent / target).exists()]
  assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"
