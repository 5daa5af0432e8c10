"""Resolve the Python references of the docstrings as a reader of the source resolves them, and fail on the rest.

Docstrings name objects the way the code around them does: ``:class:`RewardError``` where ``RewardError`` is
imported, ``:data:`YAML_MAX_DEPTH``` for a constant of the module, ``:func:`decoder.coverage``` for a sibling
module's function. Sphinx looks a name up in the current module and at the top level only. On ``missing-reference``
this extension tries, in order:

1. the one documented object whose dotted name ends with ``.<name>`` (several that are the same Python object, a
   class and its re-export from a package, count as one: the defining module's is linked);
2. a module-level name without a docstring of its own (a constant, a table): the module that defines it is linked;
3. a name of another package (the standard library, torch, transformers): plain text, as intersphinx would link it
   online and this build is offline.

A name that none of these finds, or that names two different objects, stays unresolved, so ``-n -W`` fails the
build on it.
"""

from __future__ import annotations

import importlib
import importlib.util

from docutils import nodes

PACKAGE = "rlhfkit"


def _lookup(dotted: str):
    """The Python object named ``dotted`` (module, then attributes), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not a module at this cut
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return None
            obj = getattr(obj, attr)
        return obj
    return None


def _link(app, node, contnode, docname: str, anchor: str, title: str):
    ref = nodes.reference("", "", internal=True)
    ref["refuri"] = app.builder.get_relative_uri(node.get("refdoc", ""), docname) + "#" + anchor
    ref["reftitle"] = title
    ref.append(contnode)
    return ref


def _unique_object(domain, target: str):
    found = [name for name in domain.objects if name == target or name.endswith("." + target)]
    if not found:
        return None
    if len(found) > 1:
        objs = {id(_lookup(name)) for name in found}
        if len(objs) != 1 or _lookup(found[0]) is None:
            return None
        found.sort(key=len)  # a re-export from a package is the shorter name; the defining module's is the longest
    return found[-1]


def _module_defining(domain, node, target: str):
    """The documented module that holds ``target`` (a module-level name, maybe prefixed by a module's last parts)."""
    head, _, name = target.rpartition(".")
    modules = list(domain.modules)
    current = node.get("py:module")
    candidates = []
    for mod in modules:
        if head and not (mod == head or mod.endswith("." + head)):
            continue
        if not head and mod != current:
            continue
        candidates.append(mod)
    if not head and not candidates and current:
        candidates = [current]
    hits = [mod for mod in candidates if hasattr(_lookup(mod) or object(), name)]
    return hits[0] if len(hits) == 1 else None


def _resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip(".~")
    if not target:
        return None
    domain = env.get_domain("py")
    name = _unique_object(domain, target)
    if name is not None:
        obj = domain.objects[name]
        return _link(app, node, contnode, obj.docname, obj.node_id, name)
    module = _module_defining(domain, node, target)
    if module is not None:
        entry = domain.modules[module]
        return _link(app, node, contnode, entry.docname, entry.node_id, f"{module}.{target.rpartition('.')[2]}")
    top = target.split(".")[0]
    if top != PACKAGE and importlib.util.find_spec(top) is not None:
        return contnode  # another package's name: plain text (no inventories offline)
    return None


def setup(app):
    app.connect("missing-reference", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
