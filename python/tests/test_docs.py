"""The Python examples of README.md and docs/python.md run as they stand."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_python_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    out = subprocess.run([sys.executable, "-c", block], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[7. 7. 7. 7.]", "1"]


def test_python_md_channel_example():
    """docs/python.md's Channel example: recv's array has room for
    msg_size bytes, and the example prints what it received."""
    with open(os.path.join(ROOT, "docs", "python.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    block = [b for b in blocks if "mgpu.Channel(" in b and "mgpu.init(" in b]
    assert len(block) == 1, "no runnable Channel example in docs/python.md"
    out = subprocess.run([sys.executable, "-c", block[0]], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["400 250.0"]


def test_bench_runs_and_prints_json():
    out = subprocess.run([sys.executable, "-m", "mgpu.bench", "--json",
                          "--rounds", "1", "--iters", "20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json
    res = json.loads(out.stdout)
    assert res["bench"] == "python" and len(res["results"]) == 3
    for r in res["results"]:
        assert r["value"] > 0 and r["baseline"]["value"] > 0
