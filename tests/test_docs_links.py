"""Every relative link in README.md and docs/ (lab notes too) points at a file or folder that
exists, resolved from the folder of the page that holds it (as GitHub resolves it); every
#anchor, in a page's links and in the docs/X.md#anchor that code and configs print, names a
heading of its page; the reference pages stay short and link their lab notes."""
import re

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Reference pages: what a user runs and what they get, at most 160 lines; the run-by-run
# record in docs/lab_notes/ under the same name (issue 56).
REFERENCE_PAGES = ["PARSING.md", "PERFORMANCE.md", "RECIPE.md", "SCALE.md"]
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


def heading_anchors(text: str) -> set[str]:
  """The anchors GitHub gives a page's headings: lower case, punctuation but - and _ dropped,
  spaces as -, a repeated one suffixed -1, -2, ..."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
  anchors, seen = set(), {}
  for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.MULTILINE):
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
    seen[slug] = seen.get(slug, 0) + 1
  return anchors


def test_heading_anchors_are_github_s():
  text = ("# Paper scale: what base and big need\n## Table 4's significance\n"
          "## Attention through jax.nn.dot_product_attention: tried, not kept\n## Runs\n"
          "```\n# not a heading\n```\n### Runs\n## The paper's run (WSJ, accelerator)\n")
  assert heading_anchors(text) == {
      "paper-scale-what-base-and-big-need", "table-4s-significance",
      "attention-through-jaxnndot_product_attention-tried-not-kept", "runs", "runs-1",
      "the-papers-run-wsj-accelerator"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_anchor_names_a_heading_of_its_page(page):
  text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
  broken = []
  for target in (match.group(1) for match in LINK.finditer(text)):
    path, _, anchor = target.partition("#")
    if not anchor or re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
      continue
    linked = (page.parent / path) if path else page
    if linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text("utf-8")):
      broken.append(target)
  assert not broken, f"{page.relative_to(REPO)}: anchors that name no heading: {broken}"


def test_anchors_that_code_and_configs_name_are_headings():
  """docs/X.md#anchor in a Python file, a config, the Makefile or a notebook (a log line's
  pointer, a docstring's): the page has that heading."""
  files = [*REPO.glob("*.py"), *REPO.glob("Makefile"), *(REPO / "aiayn_flax").rglob("*.py"),
           *(REPO / "configs").glob("*.py"), *(REPO / "bench").glob("*.py"),
           *(REPO / "scripts").rglob("*"), *(REPO / "notebooks").glob("*.ipynb")]
  broken = []
  for path in files:
    if not path.is_file():
      continue
    for page, anchor in re.findall(r"(docs/[\w/]+\.md)#([\w-]+)", path.read_text("utf-8")):
      if anchor not in heading_anchors((REPO / page).read_text("utf-8")):
        broken.append(f"{path.relative_to(REPO)}: {page}#{anchor}")
  assert not broken, broken


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_a_reference_page_is_short_and_links_its_lab_notes(name):
  text = (REPO / "docs" / name).read_text(encoding="utf-8")
  assert len(text.splitlines()) <= 160, f"docs/{name}: {len(text.splitlines())} lines"
  assert f"(lab_notes/{name}" in text, f"docs/{name} does not link lab_notes/{name}"
  assert (REPO / "docs" / "lab_notes" / name).exists()
