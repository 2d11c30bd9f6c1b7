"""The docs' examples run as written, and the docs index lists what exists."""
import re
import subprocess
import sys

from conftest import ROOT


def _python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_actor_example_of_extending_md_passes_as_written(tmp_path):
    actor, test = _python_blocks(ROOT / "docs/extending.md")[:2]
    (tmp_path / "test_doubler.py").write_text(actor + "\n" + test)
    (tmp_path / "conftest.py").write_text("from emulator.testing import deterministic, vclock  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed" in p.stdout


def test_docs_index_lists_every_document_present():
    index = (ROOT / "docs/README.md").read_text()
    for doc in (ROOT / "docs").glob("*.md"):
        if doc.name != "README.md":
            assert f"({doc.name})" in index, f"docs/README.md does not list {doc.name}"


def test_user_facing_text_does_not_point_outside_the_repository():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for path in texts:
        assert "../shared" not in path.read_text(), path
    help_text = subprocess.run([sys.executable, "-m", "tools.cli", "validate", "--schema",
                                str(ROOT / "scenarios/ahbm/microbench.yaml")],
                               capture_output=True, text=True, timeout=300).stdout
    assert "scenario file:" in help_text
    assert "../shared" not in help_text and "seed §" not in help_text
