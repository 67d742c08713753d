"""The type stubs (``.pyi``) against the modules they describe.

A user's type checker reads the stubs, never the compiled module: a name
missing from ``_core.pyi`` is an error in their code even though it runs.
Every name a compiled class defines (dunders aside; its private methods
are the facades' interface) must be in its stub, every name of the stub
must exist, and a stubbed function or method must take the parameters the
implementation takes (by name and kind). ``_core.pyi`` describes the pure
core as well (the twin has the same API); the pure hasher has only the
module's functions, so of a twin its public names are checked, and the
stub's names only where it is complete.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import WrapperDescriptorType

import pytest
from conftest import C_EXT_MARK

KVPOOL = Path(importlib.util.find_spec("kvpool").origin).parent

# (stub, module, compiled, has every name of the stub)
CASES = [
    pytest.param(
        "_core", "kvpool._core", True, True, id="core-c-extension", marks=C_EXT_MARK
    ),
    pytest.param("_core", "kvpool._core_py", False, True, id="core-pure-python"),
    pytest.param(
        "_hasher",
        "kvpool._hasher",
        True,
        True,
        id="hasher-c-extension",
        marks=C_EXT_MARK,
    ),
    pytest.param("_hasher", "kvpool._hasher_py", False, False, id="hasher-pure-python"),
    *(
        pytest.param(
            name,
            f"kvpool.{name}",
            True,
            True,
            id=f"manager{name}-c-extension",
            marks=C_EXT_MARK,
        )
        for name in ("_manager", "_plan", "_allocate", "_caching", "_lookup")
    ),
]
PARAMS = "stub_name, module_name, compiled, complete"


class Stub:
    """What a ``.pyi`` declares: its classes (name -> {member: node}, with
    the members of stub base classes) and its module-level names."""

    def __init__(self, name: str) -> None:
        tree = ast.parse((KVPOOL / f"{name}.pyi").read_text())
        self.functions: dict[str, ast.FunctionDef] = {}
        self.names: set[str] = set()
        own: dict[str, dict[str, ast.AST]] = {}
        bases: dict[str, list[str]] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                own[node.name] = _members(node.body)
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            self.names.update(_members([node]))
        self.classes: dict[str, dict[str, ast.AST]] = {}
        for cls in own:
            members: dict[str, ast.AST] = {}
            chain = [cls]
            while chain:
                c = chain.pop()
                for k, v in own.get(c, {}).items():
                    members.setdefault(k, v)
                chain.extend(bases.get(c, []))
            self.classes[cls] = members


def _members(body: list[ast.stmt]) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out.setdefault(n.name, n)  # a property's getter, not its setter
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
        elif isinstance(n, ast.Assign):
            out.update((t.id, n) for t in n.targets if isinstance(t, ast.Name))
    return out


def _stub_parameters(fn: ast.FunctionDef) -> list[tuple[str, str]]:
    a = fn.args
    params = [(p.arg, "positional") for p in a.posonlyargs + a.args]
    if a.vararg:
        params.append(("*" + a.vararg.arg, "var"))
    params += [(p.arg, "keyword") for p in a.kwonlyargs]
    if a.kwarg:
        params.append(("**" + a.kwarg.arg, "var"))
    return params


def _parameters(obj) -> list[tuple[str, str]] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # a builtin without a text signature: nothing to compare
    out = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append(("*" + p.name, "var"))
        elif p.kind is p.VAR_KEYWORD:
            out.append(("**" + p.name, "var"))
        elif p.kind is p.KEYWORD_ONLY:
            out.append((p.name, "keyword"))
        else:
            out.append((p.name, "positional"))
    return out


@pytest.mark.parametrize(PARAMS, CASES)
def test_every_class_member_is_stubbed(
    stub_name: str, module_name: str, compiled: bool, complete: bool
) -> None:
    stub, mod = Stub(stub_name), importlib.import_module(module_name)
    for cls_name, members in stub.classes.items():
        cls = getattr(mod, cls_name, None)
        if cls is None and not complete:
            continue
        assert isinstance(cls, type), (
            f"{module_name}.{cls_name} is in the stub, not the module"
        )
        defined = {
            k
            for k in vars(cls)
            if not (k.startswith("__") and k.endswith("__"))
            and (compiled or k[0] != "_")
        }
        missing = sorted(defined - set(members))
        assert not missing, (
            f"{module_name}.{cls_name} defines {missing}, not in {stub_name}.pyi"
        )
        # A pure twin's private helpers may differ (its behaviour tests
        # cover what the facades call); a compiled class must have them all.
        absent = sorted(
            m
            for m in members
            if (compiled or m[0] != "_")
            and not hasattr(cls, m)
            and m not in _instance_fields(cls)
        )
        assert not absent, (
            f"{stub_name}.pyi declares {cls_name}.{absent}, not in {module_name}"
        )


def _instance_fields(cls: type) -> set[str]:
    """Attributes the stub may declare that live on instances only (a
    plain attribute set in ``__init__``): found by the class's own code
    assigning ``self.NAME``."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return set()
    return {
        node.attr
        for node in ast.walk(ast.parse(inspect.cleandoc("\n" + source)))
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


@pytest.mark.parametrize(PARAMS, CASES)
def test_module_level_names_match(
    stub_name: str, module_name: str, compiled: bool, complete: bool
) -> None:
    stub, mod = Stub(stub_name), importlib.import_module(module_name)
    public = {
        k
        for k, v in vars(mod).items()
        if not k.startswith("_")
        and not inspect.ismodule(v)
        and getattr(v, "__module__", module_name) == module_name
    }
    missing = sorted(public - stub.names)
    assert not missing, f"{module_name} defines {missing}, not in {stub_name}.pyi"
    absent = sorted(n for n in stub.names if not hasattr(mod, n))
    assert not (complete and absent), (
        f"{stub_name}.pyi declares {absent}, not in {module_name}"
    )


@pytest.mark.parametrize(PARAMS, CASES)
def test_stubbed_signatures_match(
    stub_name: str, module_name: str, compiled: bool, complete: bool
) -> None:
    stub, mod = Stub(stub_name), importlib.import_module(module_name)
    checked = 0
    targets = [
        (name, fn, getattr(mod, name))
        for name, fn in stub.functions.items()
        if hasattr(mod, name)
    ]
    for cls_name, members in stub.classes.items():
        cls = getattr(mod, cls_name, None)
        if cls is None:
            continue
        for name, node in members.items():
            if not isinstance(node, ast.FunctionDef) or _is_property(node):
                continue
            if name.startswith("__") and name not in ("__init__",):
                continue
            impl = inspect.getattr_static(cls, name, None)
            # A slot wrapper (a compiled class's __init__) shows only
            # (*args, **kwargs): nothing to compare.
            if impl is None or isinstance(
                impl, (property, staticmethod, WrapperDescriptorType)
            ):
                continue
            targets.append((f"{cls_name}.{name}", node, impl))
    for label, node, impl in targets:
        got = _parameters(impl)
        if got is None:
            continue
        want = _stub_parameters(node)
        assert got == want, (
            f"{module_name}.{label}{got} but {stub_name}.pyi says {want}"
        )
        checked += 1
    assert checked, "no signature could be compared"


def _is_property(node: ast.FunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "property")
        or (isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter"))
        for d in node.decorator_list
    )
