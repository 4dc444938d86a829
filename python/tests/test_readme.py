"""The examples of python/README.md, as written.

Every ```python block that prints "ok" is run as a script by this interpreter
(so against the package under test, never python/ of the checkout) and must
print it. A block that needs CUDA (transport "nvshmem") skips where there is
none: `scripts/gpu-run.sh torch` runs it on a GPU machine. Any other block
must say it is a fragment (`<!-- fragment -->` on the line above it) and is
at least compiled, so that no example is left out unnoticed."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
# (marked as a fragment, code) for each ```python block
BLOCKS = [(bool(mark), code) for mark, code in
          re.findall(r"(<!-- fragment -->\n)?```python\n(.*?)```", README.read_text(), re.S)]
RUNNABLE = [code for _, code in BLOCKS if 'print("ok")' in code]


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def test_readme_has_runnable_examples():
    assert len(RUNNABLE) >= 3, "python/README.md lost its runnable examples"


def test_every_block_runs_or_is_a_fragment():
    for fragment, code in BLOCKS:
        assert fragment or 'print("ok")' in code, f"neither run nor marked <!-- fragment -->:\n{code}"
        assert not (fragment and 'print("ok")' in code), f"a runnable example marked as a fragment:\n{code}"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_compiles(i):
    compile(BLOCKS[i][1], f"python/README.md block {i}", "exec")


@pytest.mark.parametrize("i", range(len(RUNNABLE)))
def test_readme_example_runs(i, tmp_path):
    code = RUNNABLE[i]
    if 'transport="nvshmem"' in code and not _cuda():
        pytest.skip("the GPU example needs CUDA and a GPU build (scripts/gpu-run.sh torch)")
    if "import torch" in code and not _cuda():
        pytest.importorskip("torch")
    script = tmp_path / f"example{i}.py"
    script.write_text(code)
    # the environment as it is: the installed package, or whatever PYTHONPATH the caller chose
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"example {i}:\n{r.stdout}\n{r.stderr}"
