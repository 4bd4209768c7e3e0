"""Sampling is lossless end to end: on a tiny model with a 259-token vocabulary, the tokens emitted by Medusa
tree sampling and by draft-model speculative sampling follow the target's exact distribution (chi-square)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from headstart.eval.engine.acceptance import target_probs
from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers import proposer_config
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.engine.proposers.eagle import Eagle3Options
from headstart.eval.engine.proposers.lookahead import LookaheadOptions
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

N_SAMPLES = 1200
TEMPERATURE, TOP_P = 0.2, 0.95


def tiny(seed: int, init: float):
    cfg = BackboneConfig(
        name=f"tiny{seed}", path="tiny", dtype="float32", tiny={"seed": seed, "initializer_range": init}
    )
    return load_backbone(cfg)


@pytest.fixture(scope="module")
def target():
    return tiny(0, 0.1)  # at T=0.2: p(t1) max ~ .3 and p(t2 | t1) neither flat nor a point mass


def exact_next(backbone, prefixes: list[list[int]]) -> torch.Tensor:
    """(len(prefixes), V): the target's sampling distribution after each prefix (all the same length)."""
    with torch.no_grad():
        logits = backbone.model(torch.tensor(prefixes)).logits[:, -1]
    return target_probs(logits, TEMPERATURE, TOP_P)


def chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Cells expected >= 5 each, the rest pooled into one cell (dropped when empty and impossible)."""
    n = counts.sum()
    expected, counts = probs.ravel() * n, counts.ravel()
    big = expected >= 5
    assert counts[expected == 0].sum() == 0, "sampled a token the target gives probability 0"
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    return chisquare(obs, exp * n / exp.sum()).pvalue


def check_lossless(decoder, backbone, prompt, n_samples=N_SAMPLES):
    V = backbone.vocab_size
    t1_t2 = np.zeros((V, V))
    samples, accepted = [], 0
    for seed in range(n_samples):
        out = decoder.generate(prompt, 3, temperature=TEMPERATURE, top_p=TOP_P, seed=seed, eos_token_ids=[])
        samples.append(out.tokens)
        t1_t2[out.tokens[0], out.tokens[1]] += 1
        accepted += sum(out.stats.accepted_by_position)
    # drafts were really accepted (and rejected): otherwise this would only test plain sampling
    assert 0.1 * n_samples < accepted < 1.9 * n_samples, accepted
    p1 = exact_next(backbone, [prompt])[0]  # (V,)
    p2 = exact_next(backbone, [prompt + [t] for t in range(V)])  # (V, V): p(t2 | t1)
    assert chi2_p(t1_t2, (p1[:, None] * p2).numpy()) > 1e-3
    # the second level of the tree: (t2, t3) given the first token t1 = a frequent one with an uncertain t2
    first = int((p1 * (1 - p2.max(-1).values)).argmax())
    t2_t3 = np.zeros((V, V))
    for s in samples:
        if s[0] == first:
            t2_t3[s[1], s[2]] += 1
    assert t2_t3.sum() > 100
    p3 = exact_next(backbone, [prompt + [first, t] for t in range(V)])  # (V, V): p(t3 | first, t2)
    assert chi2_p(t2_t3, (p2[first][:, None] * p3).numpy()) > 1e-3


def test_medusa_tree_sampling_matches_target(target):
    # untrained heads propose the top tokens of p(t1) for t2, t3: on this model (which tends to repeat) often
    # right, sometimes at rank 1-2 after rank 0 was rejected (residual over siblings), sometimes not at all
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), target)
    decoder = Decoder(target, MedusaOptions(heads, tree=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0]]))
    check_lossless(decoder, target, target.tokenizer("the cat")["input_ids"])


def test_draft_model_sampling_matches_target(target):
    draft = tiny(0, 0.1)  # a noisy copy of the target: q close to p but not equal, so both outcomes happen
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in draft.parameters():
            p.mul_(1 + 0.5 * torch.randn(p.shape, generator=g))
    decoder = Decoder(target, DraftOptions(draft, num_draft_tokens=2))
    check_lossless(
        decoder, target, target.tokenizer("the cat")["input_ids"], n_samples=800
    )  # 2 models: slower


def test_prompt_lookup_sampling_matches_target(target):
    decoder = Decoder(target, PromptLookupOptions(num_draft_tokens=2, max_ngram=1))
    prompt = target.tokenizer("the cat")["input_ids"]
    # seed the context so that lookups hit: each likely first token appears earlier, repeated (this model
    # tends to repeat), so the lookup proposes x, x after x
    likely = exact_next(target, [prompt])[0].topk(6).indices.tolist()
    prompt = [t for x in likely for t in (x, x, x)] + prompt
    check_lossless(decoder, target, prompt)


def test_lookahead_sampling_matches_target(target):
    # the window starts from prompt tokens and the pool from the target's own argmax trajectories: on the
    # seeded prompt both often hold the likely next tokens, so guesses are accepted and rejected
    decoder = Decoder(target, LookaheadOptions(window=3, ngram=3, guesses=3))
    check_lossless(decoder, target, seeded_prompt(target))


def seeded_prompt(target, top: int = 4, rounds: int = 12) -> list[int]:
    """The prompt: "the cat" after "x x x" for each of its `top` likely next tokens x, the set grown (each seed
    shifts the distribution) until it holds them all, so lookups after the first token hit and propose x, x."""
    base = target.tokenizer("the cat")["input_ids"]
    seen, prompt = [], base
    for _ in range(rounds):
        new = [x for x in exact_next(target, [prompt])[0].topk(top).indices.tolist() if x not in seen]
        if not new:
            return prompt
        seen += new
        prompt = [t for x in seen for t in (x, x, x)] + base
    raise AssertionError(f"the likely next tokens did not settle in {rounds} rounds")


def medusa_with_branch(target):
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), target)
    return Decoder(target, MedusaOptions(heads, tree=[[0], [1]]), lookup_tokens=2)


def eagle3_with_branch(target):
    from headstart.models.eagle_config import Eagle3Config

    drafter = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259, ttt_steps=2), target).eval()
    return Decoder(target, Eagle3Options(drafter, tree_nodes=3, topk=2, num_draft_tokens=2), lookup_tokens=2)


@pytest.mark.parametrize("make", [medusa_with_branch, eagle3_with_branch])
def test_a_lookup_branch_sampling_matches_target(target, make):
    """A Medusa tree / EAGLE-3's dynamic tree plus prompt lookup's chain merged as a trie
    (eval/engine/proposers/lookup_branch.py): the siblings stay distinct point masses, so recursive rejection
    sampling stays lossless; the branch is taken."""
    torch.manual_seed(0)
    decoder = make(target)
    check_lossless(decoder, target, seeded_prompt(target))
    assert decoder.proposer.counts["won"] > 0.2 * N_SAMPLES, decoder.proposer.counts


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_dynamic_tree_sampling_matches_target(target, method):
    """EAGLE-2's dynamic tree (top-k candidates of a trained EAGLE-1 / EAGLE-3 drafter, re-ranked) under
    recursive rejection sampling: the emitted tokens follow the target's distribution."""
    from headstart.models.eagle_config import Eagle3Config, EagleConfig

    cfg = EagleConfig(noise=0.0) if method == "eagle" else Eagle3Config(draft_vocab_size=259, ttt_steps=2)
    torch.manual_seed(0)
    drafter = build_drafter(method, cfg, target)
    prompt = target.tokenizer("the cat")["input_ids"]
    g = torch.Generator().manual_seed(0)
    rows = []  # sampled continuations of the prompt (what the drafter will be asked to predict)
    for _ in range(16):
        ids = list(prompt)
        for _ in range(6):
            ids.append(int(torch.multinomial(exact_next(target, [ids])[0], 1, generator=g)))
        rows.append(ids)
    ids = torch.tensor(rows)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    final, aux = target(ids, batch["attention_mask"], layers=drafter.aux_layers)
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(30):
        loss, n, _ = drafter(aux if drafter.v3 else [final], final, batch)
        (loss / n).backward()
        opt.step()
        opt.zero_grad()
    decoder = Decoder(
        target, proposer_config(method, drafter=drafter.eval(), tree_nodes=6, topk=3, num_draft_tokens=2)
    )
    check_lossless(decoder, target, prompt, n_samples=1000)
