"""Draft trees for tree speculative verify (docs/design.md section 7.1) and the path-by-path
reference: every root-to-leaf path of a tree run alone, as a chain, from the start slot.

A tree is a parent array [T] in topological order (a parent before its children): parent[0]
is not read (token 0 starts from the start slot), parent[t] in [-1, t) for t >= 1, -1 meaning
the start slot's state (a second root). ``eagle_tree`` builds the shape an EAGLE draft with
``topk`` children per node and ``depth`` levels has; ``sglang_parents`` turns SGLang's
``retrieve_next_token`` / ``retrieve_next_sibling`` lists into ``retrieve_parent_token``
(written out here from SGLang's description: a child's parent is the node whose first child it
is, a sibling's parent its elder sibling's; the root's entry stays 0)."""
from __future__ import annotations

import numpy as np

import kdacupy


def eagle_tree(topk=2, depth=4):
    """Every node of ``depth`` levels below the root has ``topk`` children, breadth first:
    1 + topk + ... + topk^depth tokens."""
    parent, level = [0], [0]
    for _ in range(depth):
        nxt = []
        for p in level:
            for _ in range(topk):
                parent.append(p)
                nxt.append(len(parent) - 1)
        level = nxt
    return np.array(parent, np.int64)


def random_tree(T, rng, roots=0.2):
    """Random parents in [0, t) (a fraction ``roots`` of them -1: a second root)."""
    parent = np.zeros(T, np.int64)
    for t in range(1, T):
        parent[t] = -1 if rng.random() < roots else rng.integers(0, t)
    return parent


def sglang_parents(next_token, next_sibling):
    """retrieve_parent_token from SGLang's first-child / next-sibling lists (-1: none)."""
    T = len(next_token)
    parent = np.zeros(T, np.int64)
    for t in range(T):
        if next_token[t] != -1:
            parent[next_token[t]] = t
        if next_sibling[t] != -1:
            parent[next_sibling[t]] = parent[t]
    return parent


def path_to(parent, t):
    """The tokens from the root to t, in order (t = 0 and -1 parents are roots)."""
    path = [t]
    while path[-1] != 0 and parent[path[-1]] >= 0:
        path.append(int(parent[path[-1]]))
    return path[::-1]


def leaf_paths(parent):
    """One path per leaf; together they hold every token."""
    T = len(parent)
    has_child = np.zeros(T, bool)
    for t in range(1, T):
        if parent[t] >= 0:
            has_child[parent[t]] = True
    return [path_to(parent, t) for t in range(T) if not has_child[t]]


def path_by_path(x, opts, pool, parents, step_dtype, backend):
    """(o [N, T, HV, V], step states [N, T, ...]) of a tree verify call, from each sequence's
    leaf paths run alone as chains (``kda_decode`` with [1] indices, the pool left unwritten)."""
    N, T = x["q"].shape[:2]
    o = np.zeros(x["v"].shape, x["v"].dtype)
    tail = pool.shape[1:]
    steps = np.zeros((N, T) + tail, step_dtype)
    idx = np.asarray(opts["state_indices"])
    for n in range(N):
        for path in leaf_paths(parents[n]):
            xs = {name: a[n:n + 1, path] for name, a in x.items() if a is not None}
            buf = np.zeros((1, len(path)) + tail, step_dtype)
            on = kdacupy.kda_decode(**xs, state_pool=pool, **dict(opts, state_indices=idx[n:n + 1]), step_states=buf,
                                    update_pool=False, backend=backend)
            o[n, path] = on[0]
            steps[n, path] = buf[0]
    return o, steps
