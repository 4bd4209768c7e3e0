"""Acceptance rules for speculative decoding, as pure functions of the target's verify output.

Notation: a verify forward over a tree of N nodes (node 0 = root, the last emitted token; `parents[i] < i`)
gives the target's next-token distribution p_i after every node i. Every rule returns `(path, bonus)`: the
accepted node indices from the root (path[0] == 0) and one more token drawn from the target after path[-1].
Emitting path[1:] tokens then `bonus` is one step.

- `greedy_tree`: temperature 0. Node i is accepted iff its parent is and token_i == argmax p_parent(i); the
  longest accepted path wins. Lossless: the output is the target's greedy continuation.
- `sample_tree`: temperature > 0, deterministic drafts (Medusa top-k, prompt lookup: each draft distribution
  is a point mass). Recursive rejection sampling over siblings (SpecInfer, Miao et al. 2024, Alg. 2 with
  point-mass drafts; EAGLE's multi-draft sampling). At a node with target distribution p and children tokens
  x_1..x_m, keep a residual r (initially p):

      for x_j in order: accept x_j with probability r(x_j) / sum(r); else set r(x_j) = 0 (r <- norm(max(0, r - q_j))
      with q_j the point mass on x_j). If no child is accepted, the next token is drawn from norm(r).

  Derivation that the emitted token t is distributed exactly as p: let S_j = p(x_1) + ... + p(x_j) (x's distinct;
  a repeated token is rejected surely, because its r is already 0). After j-1 rejections r = p on
  V minus {x_1..x_{j-1}}, of mass 1 - S_{j-1}, so x_j is accepted with probability p(x_j) / (1 - S_{j-1}), and
  all of x_1..x_{j-1} were rejected with probability prod_{i<j} (1 - p(x_i)/(1 - S_{i-1})) = 1 - S_{j-1}
  (the product telescopes). Hence P(t = x_j) = (1 - S_{j-1}) p(x_j) / (1 - S_{j-1}) = p(x_j), and for any other y,
  P(t = y) = (1 - S_m) p(y) / (1 - S_m) = p(y). An accepted child's subtree is then processed with that child's
  own target distribution, so by induction the whole emitted sequence is distributed as ancestral sampling
  from the target.
- `sample_chain`: temperature > 0, a chain drawn from a draft model with distributions q_1..q_K (Leviathan et
  al. 2023, Alg. 1; Chen et al. 2023): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
  rejection draw from norm(max(0, p_i - q_i)); if all K are accepted draw the bonus from p_{K+1}. Lossless.
- `typical_tree`: Medusa's typical acceptance (Cai et al. 2024, Sec. 2.3.1): accept x if
  p_parent(x) > min(epsilon, alpha * exp(-H(p_parent))). LOSSY: the output is not distributed as the target's
  samples; it trades fidelity for longer accepted paths at high temperature.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 sampling distribution: softmax(logits / T), then nucleus (top-p)
    truncation to the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # mass strictly before the token already reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) (Leviathan et al. 2023, Eq. after Thm. 3.5); falls back to p where p == q."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-30), p)


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _path_to(node: int, parents: list[int]) -> list[int]:
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _longest(accepted: list[bool], parents: list[int]) -> list[int]:
    """Deepest accepted node (first in index order among equals) -> its root path. `accepted[0]` is True and a
    node counts only when its parent does."""
    depth = [0] * len(parents)
    best = 0
    for i in range(1, len(parents)):
        if accepted[i] and accepted[parents[i]]:
            depth[i] = depth[parents[i]] + 1
            if depth[i] > depth[best]:
                best = i
        else:
            accepted[i] = False
    return _path_to(best, parents)


def greedy_tree(tokens: list[int], parents: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """tokens[i]: token of node i; target_argmax[i]: the target's argmax after node i. -> (path, bonus)."""
    accepted = [True] + [tokens[i] == target_argmax[parents[i]] for i in range(1, len(tokens))]
    path = _longest(accepted, parents)
    return path, target_argmax[path[-1]]


def sample_tree(
    tokens: list[int], parents: list[int], probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Recursive rejection sampling with point-mass drafts; probs (N, V) = target distribution after node i.
    See the module docstring for the derivation that this is lossless."""
    children: list[list[int]] = [[] for _ in tokens]
    for i in range(1, len(tokens)):
        children[parents[i]].append(i)
    path, node = [0], 0
    while children[node]:
        r = probs[node].clone()  # (V,) residual, unnormalised
        mass = float(r.sum())
        uniforms = torch.rand(len(children[node]), generator=generator, device=probs.device).tolist()
        for child, u in zip(children[node], uniforms):
            px = float(r[tokens[child]])
            if u * mass < px:  # accept with probability r(x) / sum(r)
                break
            mass -= px
            r[tokens[child]] = 0.0
        else:  # every child rejected: draw from the residual
            return path, _sample(r if mass > 1e-12 else probs[node], generator)
        path.append(child)
        node = child
    return path, _sample(probs[node], generator)


def sample_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative sampling of a K-chain drawn from a draft model. draft_tokens (K,), draft_probs (K, V) the
    distributions they were drawn from, target (K+1, V). -> (number of accepted drafts n, next token)."""
    k = draft_tokens.shape[0]
    idx = torch.arange(k, device=target.device)
    p_x = target[idx, draft_tokens]  # (K,)
    q_x = draft_probs[idx, draft_tokens]  # (K,)
    u = torch.rand(k, generator=generator, device=target.device)
    ok = u * q_x < p_x  # u < p/q: accept with probability min(1, p/q)
    n = int(ok.int().cumprod(0).sum())
    if n == k:
        return n, _sample(target[k], generator)
    return n, _sample(residual(target[n], draft_probs[n]), generator)


def typical_tree(
    tokens: list[int],
    parents: list[int],
    probs: torch.Tensor,
    generator: torch.Generator | None = None,
    epsilon: float = 0.09,
    alpha: float = 0.3,
) -> tuple[list[int], int]:
    """Medusa typical acceptance (LOSSY, see module docstring); the bonus is drawn from the target after the
    last accepted node. Defaults are Medusa's posterior_threshold=0.09, posterior_alpha=0.3."""
    entropy = torch.special.entr(probs).sum(-1)  # (N,) nats
    threshold = torch.clamp(alpha * torch.exp(-entropy), max=epsilon)  # (N,)
    par = torch.tensor(parents[1:], device=probs.device)
    tok = torch.tensor(tokens[1:], device=probs.device)
    ok = (probs[par, tok] > threshold[par]).tolist()
    path = _longest([True, *ok], parents)
    return path, _sample(probs[path[-1]], generator)
