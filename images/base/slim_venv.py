"""Take out of an image's venv what no role uses, then prove that what is left still imports.

Run by images/base/Dockerfile with the venv's own interpreter:

    python slim_venv.py trim                         # venv stage: files no role reads
    python slim_venv.py extensions --record FILE     # venv stage: the extension modules that import
    python slim_venv.py elf                          # strip stage: the shared objects, NUL-separated (xargs -0)
    python slim_venv.py extensions --check FILE      # strip stage, after `strip`: each of them still imports

Each step is generic (no role's name appears here): a role that lacks a package simply has nothing to trim there.
"""

from __future__ import annotations

import ast
import compileall
import importlib
import re
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])
#: The Kubernetes client's generated code: 60 % of its source is the OpenAPI descriptions as docstrings.
GENERATED = ("kubernetes/client/api", "kubernetes/client/models")
#: What the MSK IAM login needs of botocore's service models: STS and SSO, for the credential providers.
BOTOCORE_MODELS = {"sts", "sso", "sso-oidc"}
#: Sources and type stubs wheels ship next to their extension modules; nothing reads them at run time.
SOURCE_SUFFIXES = {".pyx", ".pxd", ".pyi", ".c", ".h"}


def _without_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body[:1] = [] if len(body) > 1 else [ast.Pass()]
    return ast.unparse(tree)


def trim() -> None:
    # kubernetes.aio: the asyncio twin of the client, half of the package; no role imports it.
    shutil.rmtree(SITE / "kubernetes" / "aio", ignore_errors=True)
    # boto3's resource models (s3, ec2, ...): the MSK IAM signer uses a boto3 Session for credentials only.
    shutil.rmtree(SITE / "boto3" / "data", ignore_errors=True)
    models = SITE / "botocore" / "data"
    if models.is_dir():
        for service in models.iterdir():
            if service.is_dir() and service.name not in BOTOCORE_MODELS:
                shutil.rmtree(service)
    for path in list(SITE.rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            path.unlink()
    # Every role imports all of the generated client (client/__init__ imports every API and model), so it cannot be
    # left out; its docstrings and, once compiled, its sources can. A traceback through it still names the file,
    # the line and the function.
    for folder in (SITE / d for d in GENERATED):
        if not folder.is_dir():
            continue
        shutil.rmtree(folder / "__pycache__", ignore_errors=True)
        for path in folder.glob("*.py"):
            path.write_text(_without_docstrings(path.read_text()))
        if not compileall.compile_dir(folder, quiet=1, legacy=True, maxlevels=0):
            raise SystemExit(f"compileall failed in {folder}")
        for path in folder.glob("*.py"):
            path.unlink()
    check = [
        "import botocore.session",
        "from aws_msk_iam_sasl_signer import MSKAuthTokenProvider",
        'botocore.session.get_session().create_client("sts", region_name="eu-west-1")',
    ]
    if (SITE / "kubernetes").is_dir():
        check += ["from kubernetes import client, config, watch",
                  "client.CoreV1Api, client.CustomObjectsApi, client.V1Lease().to_dict()"]
    exec("\n".join(check), {})  # noqa: S102 - fixed statements: fail the build if the trim went too far


def elf() -> None:
    """The shared objects `strip` may rewrite: ELF by content, not by name (wheels ship data files whose names contain
    ".so", such as pyarrow's test Parquet files), outside auditwheel's ``<dist>.libs`` folders. Those hold external
    libraries that patchelf rewrote (soname, RPATH), and binutils' strip can leave such a file unloadable (numpy's
    OpenBLAS: "ELF load command address/offset not page-aligned")."""
    for path in sorted(SITE.rglob("*.so*")):
        if any(part.endswith(".libs") for part in path.relative_to(SITE).parts[:-1]):
            continue
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    sys.stdout.write(f"{path}\0")


def _extension_modules() -> list[str]:
    return sorted(".".join(p.relative_to(SITE).with_suffix("").with_suffix("").parts) for p in SITE.rglob("*.so")
                  if re.search(r"\.(cpython-[^.]+|abi3)\.so$", p.name))


def extensions(mode: str, listing: str) -> None:
    """``--record``: write the extension modules that import now; ``--check``: every one of them must still import.

    Recorded before `strip` and checked after it, so that a module which never loaded here (PIL's Tk bridge, with
    no tkinter in the image) is no reason to fail, and one that `strip` broke is.
    """
    if mode == "--record":
        loadable = []
        for name in _extension_modules():
            try:
                importlib.import_module(name)
            except ImportError:
                continue
            loadable.append(name)
        Path(listing).write_text("\n".join(loadable) + "\n")
        print(f"{len(loadable)} extension modules load")
        return
    names = Path(listing).read_text().split()
    for name in names:
        importlib.import_module(name)
    print(f"{len(names)} extension modules still load")


if __name__ == "__main__":
    commands: dict[str, Callable[..., None]] = {"trim": trim, "elf": elf, "extensions": extensions}
    commands[sys.argv[1]](*sys.argv[2:])
