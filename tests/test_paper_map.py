"""PAPER_MAP.md's Deviations table and the code's ``DEVIATION(§x)`` comments name each other: every file with
such a comment is a row's place, and every file a row names as its place holds one (the table said
``benchmarks/table3.py`` scores on Multi30k val where the file had no comment saying so, and the code map
named a function no longer in the package)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("transformer", "configs", "benchmarks")  # where the table's places are


def places() -> list[str]:
    """The first cell of each Deviations row: where the deviation is."""
    table = (ROOT / "PAPER_MAP.md").read_text(encoding="utf-8").split("\n## Deviations", 1)[1].split("\n## ", 1)[0]
    return [line.split(" | ")[0] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| where")]


def named(cell: str) -> list[Path]:
    """The files a cell names in backquotes: a path from the repository's root, or a bare name beside the
    path named before it in the cell (`configs/base.toml`, `big.toml`)."""
    found, folder = [], ROOT
    for name in re.findall(r"`([\w./-]+\.(?:py|toml))`", cell):
        path = ROOT / name if "/" in name else folder / name
        folder = path.parent
        found.append(path)
    return found


def commented() -> set[Path]:
    return {p for folder in FOLDERS for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".toml")
            and "DEVIATION(" in p.read_text(encoding="utf-8")}


def test_every_deviation_comment_has_a_row_and_every_row_a_comment():
    rows = places()
    assert len(rows) >= 20, rows  # it read the table
    in_rows = {path for cell in rows for path in named(cell)}
    missing = sorted(str(p.relative_to(ROOT)) for p in commented() - in_rows)
    assert not missing, f"DEVIATION comments in files no Deviations row names: {missing}"
    for cell in rows:
        assert named(cell), f"a Deviations row names no file: {cell}"
        for path in named(cell):
            assert path.is_file(), f"{cell}: {path.relative_to(ROOT)} does not exist"
            assert "DEVIATION(" in path.read_text(encoding="utf-8"), f"{cell}: no DEVIATION comment in {path.name}"


CITED = r"§[\d.]+|A\d+"  # a paper section, or an item of IMPLEMENTATION-NOTES


def test_each_deviation_comment_is_a_row_of_its_file_with_its_sections():
    """Each file was named by some row, so a new DEVIATION in a file with one already passed unlisted: now every
    comment's sections (§x, or a notes item Ax) are cited by a row that names its file."""
    cited: dict[Path, set[str]] = {}
    for cell in places():
        for path in named(cell):
            cited.setdefault(path, set()).update(re.findall(CITED, cell))
    unlisted = []
    for path in sorted(commented()):
        text = path.read_text(encoding="utf-8")
        for comment in re.finditer(r"DEVIATION\(([^)]*)\)", text):
            sections = set(re.findall(CITED, comment.group(1)))
            if not sections or sections - cited.get(path, set()):
                line = text[:comment.start()].count("\n") + 1
                unlisted.append(f"{path.relative_to(ROOT)}:{line} cites {sorted(sections) or 'no section'}, "
                                f"its rows {sorted(cited.get(path, set()))}")
    assert not unlisted, unlisted


def test_the_code_map_names_what_the_package_has():
    """Each `module.py`: `name` pair of the tables names a function, class or field that module defines."""
    text = (ROOT / "PAPER_MAP.md").read_text(encoding="utf-8")
    checked = 0
    for line in text.splitlines():
        for module, names in re.findall(r"`(?:transformer/)?(\w+\.py)`: ((?:`[\w.]+`(?:, )?)+)", line):
            source = ROOT / "transformer" / module
            if not source.is_file():
                continue
            code = source.read_text(encoding="utf-8")
            for name in re.findall(r"`([\w.]+)`", names):
                last = name.split(".")[-1]
                assert re.search(rf"\b(def|class) {last}\b|^\s*{last}\s*[:=]|\bself\.{last}\s*[:=]", code, re.M), \
                    f"PAPER_MAP.md names {module}: {name}, which {module} does not define"
                checked += 1
    assert checked >= 30, checked
