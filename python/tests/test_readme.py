"""The examples of python/README.md run as written: every ```python block that
ends by printing "ok" is run as a script in a fresh interpreter and must print
it. A block that needs CUDA (transport "nvshmem") skips where there is none."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if 'print("ok")' in b]


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def test_readme_has_runnable_examples():
    assert len(BLOCKS) >= 2, "python/README.md lost its runnable examples"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i, tmp_path):
    code = BLOCKS[i]
    if 'transport="nvshmem"' in code and not _cuda():
        pytest.skip("the GPU example needs CUDA (and a GPU build: MOECOMM_LIB)")
    if "import torch" in code and not _cuda():
        pytest.importorskip("torch")
    script = tmp_path / f"example{i}.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(README.parent)] + sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"example {i}:\n{r.stdout}\n{r.stderr}"
