"""hack/image-cache.sh, the per-user cache of images fixed by their inputs, against a fake `docker` whose archives
are text files naming their images: a stored entry loads in another engine, each name keeps one entry, and an entry
that does not load is deleted rather than trusted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# save -o FILE IMAGE...: "archive" + the images; load -i FILE: an archive adds its images to the engine
# ($ENGINE/images), anything else fails; image inspect IMAGE...: all of them present.
FAKE_DOCKER = r"""#!/usr/bin/env bash
set -eu
case "$1" in
  save) [[ -z ${FAIL_SAVE:-} ]] || { echo partial >"$3"; exit 1; }
        out=$3; shift 3; { echo archive; printf '%s\n' "$@"; } >"$out" ;;
  load) file=$4; [[ "$(head -n1 "$file")" == archive ]] || exit 1; tail -n +2 "$file" >>"$ENGINE/images" ;;
  image) shift 2; for i in "$@"; do grep -qxF "$i" "$ENGINE/images" 2>/dev/null || exit 1; done ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def sh(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    cache = tmp_path / "cache"

    def run(script: str, engine: str = "a", **env: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / engine).mkdir(exist_ok=True)
        return subprocess.run(
            ["bash", "-c", f"set -euo pipefail; source {ROOT}/hack/image-cache.sh; {script}"],
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KE_IMAGE_CACHE": str(cache),
                 "ENGINE": str(tmp_path / engine), **env},
            capture_output=True, text=True, timeout=30, check=False)

    run.cache = cache  # type: ignore[attr-defined]
    return run


def test_an_entry_stored_in_one_engine_loads_in_another(sh) -> None:
    assert sh("image_cache_load os k1 img:1", engine="b").returncode == 1  # miss
    assert sh("image_cache_store os k1 img:1 img:2").returncode == 0
    assert sh("image_cache_load os k1 img:1 img:2", engine="b").returncode == 0
    assert sh("docker image inspect img:1 img:2", engine="b").returncode == 0
    assert sh("image_cache_load os k2 img:1", engine="b").returncode == 1  # another key: a miss


def test_each_name_keeps_only_its_newest_entry(sh) -> None:
    sh("image_cache_store os k1 img:1")
    sh("image_cache_store kind k1 node:1")
    sh("image_cache_store os k2 img:2")
    assert sorted(p.name for p in sh.cache.rglob("*")) == ["k1.tar", "k2.tar", "kind", "os"]
    assert (sh.cache / "os" / "k2.tar").exists() and (sh.cache / "kind" / "k1.tar").exists()


@pytest.mark.parametrize("content", ["partial\n", "archive\nsome-other:image\n"])
def test_an_entry_that_does_not_load_is_deleted_not_trusted(sh, content: str) -> None:
    (sh.cache / "os").mkdir(parents=True)
    (sh.cache / "os" / "k1.tar").write_text(content)
    result = sh("image_cache_load os k1 img:1")
    assert result.returncode == 1
    assert "deleting it" in result.stderr
    assert not (sh.cache / "os" / "k1.tar").exists()


def test_a_failed_save_leaves_no_entry_and_does_not_fail_the_build(sh) -> None:
    result = sh("image_cache_store os k1 img:1", FAIL_SAVE="1")
    assert result.returncode == 0
    assert "could not store" in result.stderr
    assert list((sh.cache / "os").iterdir()) == []


def test_off_stores_and_loads_nothing(sh) -> None:
    assert sh("image_cache_store os k1 img:1", KE_IMAGE_CACHE="off").returncode == 0
    assert not sh.cache.exists() and not Path("off").exists()
    assert sh("image_cache_load os k1 img:1", KE_IMAGE_CACHE="off").returncode == 1
