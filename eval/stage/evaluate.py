"""The eval stage: score drafter checkpoints by measured speedup vs vanilla, tau, acceptance by draft position,
per category (entry script: eval/run.py).

A checkpoint folder's config.json is read once (`find_checkpoints`); the backbone is rebuilt from it (dtype/device
overridable), the drafter loaded from the same metadata, and the registry (models/registry.py) says which
decoder proposer serves it. Each prompt is decoded with vanilla, the drafter and the training-free baselines
(interleaved, after a warm-up; vanilla once for all of them) through the same Decoder; see measure.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headstart.eval.engine.compiled import HARDWARE, for_hardware
from headstart.eval.engine.compiled import resolve as resolve_compile
from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers import DRAFT, LOOKAHEAD, PROPOSERS, VANILLA
from headstart.eval.engine.proposers.lookup_branch import LookupBranch
from headstart.eval.errors import EvalError
from headstart.eval.report.compare import compare, write_compare
from headstart.eval.report.write import log_wandb, write_report, write_runs_summary
from headstart.eval.scoring.measure import score_prompts
from headstart.eval.scoring.memory import MemoryUse, measure_memory, memory_report, module_bytes
from headstart.eval.scoring.score import GenOpts, aggregate, check_fits
from headstart.eval.stage.config import EvalConfig
from headstart.eval.stage.prompts import PromptSet, chat_ids, load_prompts
from headstart.eval.tuning.prompts import normalise, probe_prompts, refuse_overlap
from headstart.eval.tuning.records import Tuned, decoding_report, load_or_tune
from headstart.eval.tuning.tuner import Use
from headstart.eval.tuning.workload import of_prompts
from headstart.hardware import DtypeChoice, announce, machine_facts, resolve_dtype
from headstart.models import registry
from headstart.models.backbone import Backbone, BackboneConfig, eos_token_ids, load_backbone
from headstart.models.checkpoint import LoadedDrafter, find_checkpoints, load_drafter, step_of
from headstart.models.decoding import branch_tokens, describe_workload
from headstart.models.export.serve_card import find_serve_check
from headstart.models.int8 import for_decoding, for_draft_model

log = logging.getLogger("headstart.eval")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EvalError(f"device={name} but CUDA is not available here. Fix: device=cpu (or auto)")
    return torch.device(name)


DRAFTER = "drafter"  # the drafter's side; never a baseline's name (those are decoding methods)


@dataclass
class Target:
    """The checkpoint being scored (its folder and config.json) and the backbone it runs on."""

    ckpt: Path
    meta: dict
    bcfg: BackboneConfig
    backbone: Backbone


@dataclass
class Side:
    """One decoder scored against vanilla in the same rounds: the drafter, or a training-free baseline."""

    method: str  # decoding method (eval/engine/proposers/)
    decoder: Decoder
    # source (tuner / user / default), options, tuner record, draft weights: report["decoding"]
    settings: dict
    out_dir: Path  # where its report goes
    baseline: bool = False


EAGER_VANILLA = "vanilla-eager"  # the side timed beside a compiled vanilla (baselines/vanilla-eager/)


def compile_entry(
    mode: str, compiled: bool, speedup: float | None, eager: dict | None, chosen: dict | None = None
) -> dict:
    """The report's `compile` entry: the mode (and with compile=hardware, what it chose and why), whether this
    side's steps ran compiled, and with an eager vanilla in the same rounds, the speedup over it (= over compiled
    vanilla / eager vanilla's over compiled)."""
    out = {"mode": mode, **(chosen or {}), "compiled": compiled, "speedup_vs_compiled_vanilla": speedup}
    e = eager and eager["speedup"]
    if e and speedup:
        out |= {"eager_vanilla_vs_compiled_vanilla": e, "speedup_vs_eager_vanilla": speedup / e}
    return out


class Evaluator:
    """Scores checkpoints on one prompt set; backbones are loaded once per distinct spec."""

    def __init__(self, cfg: EvalConfig, prompts: PromptSet) -> None:
        self.cfg, self.prompts = cfg, prompts
        self.device = resolve_device(cfg.device)
        self._backbones: dict[str, Backbone] = {}
        self.dtype_choice: DtypeChoice | None = None  # the dtype of the last checkpoint evaluated, and why
        self.compile_setting = cfg.compile  # hardware: each checkpoint's mode follows its compute dtype
        self.compile_chosen: dict | None = None  # with compile=hardware: {"setting", "reason"} of the last
        self.opts = GenOpts(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed, cfg.max_cache_len)

    def backbone(self, bcfg: BackboneConfig) -> Backbone:
        key = json.dumps(asdict(bcfg), sort_keys=True, default=str)
        if key not in self._backbones:
            log.info("loading backbone %s (%s, %s) on %s", bcfg.name, bcfg.path, bcfg.dtype, self.device)
            self._backbones[key] = load_backbone(bcfg, self.device)
            self._check_prompts_fit(self._backbones[key])
        return self._backbones[key]

    def _check_prompts_fit(self, backbone: Backbone) -> None:
        """Fail before hours of decoding, not at the prompt that overflows the cache (first turns only:
        later turns depend on the answers and are checked as they come)."""
        for p in self.prompts.prompts:
            ids = chat_ids(backbone.tokenizer, [{"role": "user", "content": p.turns[0]}])
            check_fits(len(ids), self.opts, f"prompt {p.question_id!r}")

    def drafter_side(self, target: Target, out_dir: Path) -> Side:
        """The side that decodes with the drafter of `target`'s checkpoint: its decoding method, the
        speculative decoder, and the settings used and where they came from."""
        cfg, ckpt, meta, backbone = self.cfg, target.ckpt, target.meta, target.backbone
        trained = registry.get(meta["method"])
        method = cfg.method or trained.proposer  # empty: the proposer that serves the trained drafter
        # the checkpoint's drafter is used by its own proposer, unless method=draft names another draft model
        own = PROPOSERS[trained.proposer]
        uses_drafter = PROPOSERS.get(method) == own and not cfg.draft
        serves_drafters = {PROPOSERS[m.proposer] for m in registry.METHODS.values()}
        if PROPOSERS.get(method) in serves_drafters - {own} and not cfg.draft:
            raise EvalError(
                f"method={method} but {ckpt} holds a {trained.name} drafter (served by {trained.proposer}). "
                "Fix: method= (empty)"
            )
        user = cfg.proposer_options()  # unset: the tuner's choice, else the proposer's default
        options = dict(user)
        weights = None
        if cfg.draft:  # an HF draft model named on the command line (this side alone decodes with it)
            dcfg = BackboneConfig(name="draft", path=cfg.draft, dtype=target.bcfg.dtype)
            options["draft_backbone"] = self.backbone(dcfg)
            weights = for_draft_model(options["draft_backbone"].model, backbone.device, cfg.draft_weights)
        loaded = LoadedDrafter(*load_drafter(ckpt, backbone, meta), ckpt) if uses_drafter else None
        if loaded:
            weights = for_decoding(loaded.drafter, backbone.device, cfg.draft_weights)
        tuned = self.tune(method, backbone, loaded) if loaded is not None and not user else None
        settings = {
            "source": "tuner" if tuned else "user" if user else "default",
            "options": user,
            "tuner": tuned,
            "draft_weights": weights,
        }
        if tuned and tuned.plain:  # nothing pays here: the drafter's side decodes plainly, branch included
            plain = Decoder(backbone, VANILLA, max_cache_len=cfg.max_cache_len, compile=cfg.compile)
            return Side(method, plain, settings, out_dir)
        options |= tuned.record["decoder"] if tuned else {}
        # the lookup branch on the tree chosen above, as long as the tuner chose (at most lookup_tokens); the
        # decoder refuses a tree-less method
        lookup = branch_tokens(tuned and tuned.record, cfg.lookup_tokens)
        decoder = build_decoder(method, backbone, loaded, max_cache_len=cfg.max_cache_len, lookup_tokens=lookup,
                                compile=cfg.compile, **options)  # fmt: skip
        return Side(method, decoder, settings, out_dir)

    def tune(self, method: str, backbone: Backbone, loaded: LoadedDrafter) -> Tuned | None:
        """The tuner's record for this eval's condition, chosen on the tuning prompts (refused when they
        include a scored prompt) and never one tuned on the scored prompts; None with tuner.mode=off."""
        cfg = self.cfg
        if cfg.tuner.mode == "off":
            return None
        probe = probe_prompts(cfg.tuner.prompts, backbone, cfg.tuner.probe_prompts)
        refuse_overlap(probe, self.prompts)
        scored = {normalise(t) for p in self.prompts.prompts for t in p.turns}
        compiled = resolve_compile(cfg.compile, backbone.device)  # priced as the eval's decoder runs
        workload = ()
        if cfg.tuner.workload == "eval":  # the scored prompts' lengths, never their text
            workload = of_prompts(
                backbone.tokenizer, self.prompts.prompts, cfg.max_new_tokens, cfg.max_cache_len
            )
            log.info(
                "tuner: steps priced at the scored prompts' context lengths: %s", describe_workload(workload)
            )
        cache = cfg.max_cache_len if compiled else 0
        use = Use(cfg.temperature, cfg.top_p, cfg.lookup_tokens, cache, workload, cfg.max_new_tokens)
        return load_or_tune(method, backbone, loaded, probe, cfg.tuner, use, scored)

    def evaluate(
        self, ckpt: Path, meta: dict, out_dir: Path, baselines: tuple[str, ...] = (), drafter: bool = True
    ) -> dict:
        """Score the drafter of checkpoint `ckpt` (config.json = `meta`) and the training-free `baselines` on
        its backbone, every one against the same vanilla decodes in the same interleaved rounds (side by side).
        The drafter's report goes to out_dir, each baseline's to out_dir/baselines/<name>. -> {"report",
        "figures"} of the drafter (drafter=False: baselines only) and "baselines": {name: report}."""
        cfg = self.cfg
        bcfg = BackboneConfig(**meta["backbone"])
        # the checkpoint holds weights, not a compute dtype: auto decodes in what this device computes natively
        self.dtype_choice = resolve_dtype(cfg.dtype or bcfg.dtype, self.device, setting="dtype")
        announce("dtype", self.dtype_choice)
        bcfg = replace(bcfg, dtype=self.dtype_choice.dtype)
        target = Target(ckpt, meta, bcfg, self.backbone(bcfg))
        if self.compile_setting == HARDWARE:
            weights = module_bytes(target.backbone.model)
            mode, reason = for_hardware(self.device, self.dtype_choice.dtype, weights)
            log.info("compile=hardware -> %s (%s)", mode, reason)
            self.cfg = cfg = replace(cfg, compile=mode)
            self.compile_chosen = {"setting": HARDWARE, "reason": reason}
        vanilla = Decoder(target.backbone, VANILLA, max_cache_len=cfg.max_cache_len, compile=cfg.compile)
        sides: dict[str, Side] = {}  # "drafter" is never a baseline's name
        if drafter:
            sides[DRAFTER] = self.drafter_side(target, out_dir)
        default = {"source": "default", "options": {}, "tuner": None}  # the user's and tuner's: the drafter's
        for b in dict.fromkeys(baselines):  # the tuner's and the drafter's options are the drafter's alone
            chosen = cfg.lookahead.set() if b == LOOKAHEAD else {}
            spec = build_decoder(b, target.backbone, None, max_cache_len=cfg.max_cache_len, compile=cfg.compile,
                                 **chosen)  # fmt: skip
            settings = {"source": "user" if chosen else "default", "options": chosen, "tuner": None}
            sides[b] = Side(b, spec, settings, out_dir / "baselines" / b, baseline=True)
        if vanilla.runner.compiled:  # its speedup over the compiled vanilla: 1 / what compilation bought
            eager = Decoder(target.backbone, VANILLA, max_cache_len=cfg.max_cache_len)
            default = {"source": "default", "options": {}, "tuner": None}
            sides[EAGER_VANILLA] = Side(VANILLA, eager, default, out_dir / "baselines" / EAGER_VANILLA, True)
        if not sides:
            raise EvalError("nothing to score: no drafter and no baselines")
        n = len(self.prompts.prompts)
        names = " + ".join(side.method for side in sides.values())
        log.info("scoring %s (%s) on %d prompts beside one vanilla run -> %s", ckpt, names, n, out_dir)
        with tqdm(total=n, desc=f"eval {names} vs vanilla", unit="prompt") as bar:
            records, timings = score_prompts(
                vanilla,
                {name: side.decoder for name, side in sides.items()},
                target.backbone,
                self.prompts.prompts,
                self.opts,
                cfg.warmup,
                on_prompt=lambda i, total: bar.update(i - bar.n),
                timing=cfg.timing,
            )
        memory = self._memory(vanilla, {name: side.decoder for name, side in sides.items()}, target.backbone)
        out: dict = {"baselines": {}}
        eager = None  # the eager vanilla's report, scored first so the others can say what compilation bought
        for name in sorted(sides, key=lambda s: s != EAGER_VANILLA):
            side = sides[name]
            use = memory_report(memory[name], memory[VANILLA])
            res = self._report(target, side, records[name], timings[name], use, eager)
            if name == EAGER_VANILLA:
                eager = out["eager_vanilla"] = res["report"]
            elif side.baseline:
                out["baselines"][name] = res["report"]
            else:
                out |= res
        return out

    def _memory(
        self, vanilla: Decoder, specs: dict[str, Decoder], backbone: Backbone
    ) -> dict[str, MemoryUse]:
        """Each side's memory (eval/scoring/memory.py) on the first prompt's first turn, untimed, after the
        timing rounds so the profiler cannot touch their figures."""
        first = self.prompts.prompts[0]
        ids = chat_ids(backbone.tokenizer, [{"role": "user", "content": first.turns[0]}])
        eos = eos_token_ids(backbone)
        return {
            name: measure_memory(dec, ids, self.cfg.max_new_tokens, eos)
            for name, dec in {VANILLA: vanilla, **specs}.items()
        }

    def _report(
        self, target: Target, side: Side, records: list[dict], timing: dict, memory: dict, eager=None
    ) -> dict:
        cfg, n, ckpt, method = self.cfg, len(self.prompts.prompts), target.ckpt, side.method
        report = {
            "method": method,
            "backbone": {**asdict(target.bcfg), "fingerprint": target.backbone.fingerprint()},
            "checkpoint": None if side.baseline else str(ckpt),
            **({"draft": cfg.draft or str(ckpt)} if method == DRAFT else {}),  # which draft LM proposed
            "step": step_of(ckpt, target.meta),
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens,
            "device": str(self.device),
            "dtype": target.bcfg.dtype,
            "dtype_choice": self.dtype_choice.record(),  # what was asked (auto, ...) and why this dtype
            "machine": machine_facts(self.device),
            "warmup_prompts": min(cfg.warmup, n),
            "prompts": {
                "file": self.prompts.path,
                "n": n,
                "categories": self.prompts.categories,
                "bad_rows": self.prompts.bad_rows,
                "bad_examples": self.prompts.bad_examples,
            },
            **aggregate(records, greedy=cfg.temperature == 0, timing=timing),
            "timing": timing,  # pairs, rounds, step costs, bound, flags, threads and load (eval/timing/harness.py)
            # vLLM's figures for this drafter when `./launch.sh serve-check` ran on it (eval/serve_check.py)
            "vllm_serve_check": None if side.baseline else find_serve_check(ckpt),
            "memory": memory,  # this side's and vanilla's peak, the drafter's bytes, its state (scoring/memory.py)
        }
        per_turn = sum(r["vanilla"]["new_tokens"] for r in records) / sum(
            len(p.turns) for p in self.prompts.prompts
        )
        settings = side.settings
        if method == LOOKAHEAD:  # steps with pool guesses, and where the accepted path ended (every decode)
            la = side.decoder.proposer
            settings["lookahead"] = (
                dict(zip(("window", "ngram", "guesses"), la.options.resolved())) | la.counts
            )
        plain = settings.get("tuner") is not None and settings["tuner"].plain
        # the branch's length as it ran, and the steps it added nodes / gave the accepted path over every
        # decode of the run (warm-up and timing rounds included)
        branch = side.decoder.proposer
        if isinstance(branch, LookupBranch):
            settings["lookup_branch"] = {"tokens": branch.k, "allowed": cfg.lookup_tokens, **branch.counts}
        report["decoding"] = decoding_report(settings, report, per_turn)
        report["compile"] = compile_entry(
            cfg.compile, side.decoder.runner.compiled, report["speedup"], eager, self.compile_chosen
        )
        if plain:  # the headline: the drafter was not used, and why
            d = report["decoding"]
            report["headline"] = (
                f"Speculation does not pay here: plain decoding chosen ({d['choice_reason']}; record: "
                f"{d['record']}). The drafter's figures are plain decoding against itself."
            )
            log.warning("%s: %s", target.ckpt, report["headline"])
        figures = write_report(side.out_dir, report, records)
        log.info("%s (%s): tau %.3f, speedup %.3fx %s", ckpt, method, report["tau"] or 0,
                 report["speedup"] or 0, report["speedup_ci"])  # fmt: skip
        for flag in report["speedup_flags"]:
            log.warning("%s (%s): speedup flagged, not used to rank: %s", ckpt, method, flag)
        return {"report": report, "figures": figures}


def score_run_dir(ev: Evaluator, checkpoints: dict[Path, dict], root: Path, out: Path) -> tuple[dict, dict]:
    """Score every checkpoint under `root` into out/<its relative path>; mark the best. -> summary, W&B payload."""
    entries, figures = [], {}
    for ckpt, meta in checkpoints.items():
        sub = out / ckpt.relative_to(root)
        res = ev.evaluate(ckpt, meta, sub)
        r = res["report"]
        entries.append({"checkpoint": str(ckpt), "step": r["step"], "tau": r["tau"], "speedup": r["speedup"],
                        "speedup_ci": r["speedup_ci"], "predicted_speedup": r["predicted_speedup"],
                        "flags": r["speedup_flags"], "efficiency": r["efficiency"],
                        "report": str(sub / "report.json")})  # fmt: skip
        figures[str(ckpt)] = res["figures"]
    summary = write_runs_summary(out, entries)
    best = next(e for e in summary["checkpoints"] if e["best"])
    log.info("best: %s (speedup %.3fx, tau %.3f)", best["checkpoint"], best["speedup"] or 0, best["tau"] or 0)
    rows = summary["checkpoints"]
    payload = {
        "history": [{"eval/tau": e["tau"], "eval/speedup": e["speedup"], "train/step": e["step"]} for e in rows],
        "table": (["checkpoint", "step", "tau", "speedup", "best"],
                  [[e["checkpoint"], e["step"], e["tau"], e["speedup"], e["best"]] for e in rows]),
        "figures": {"tau_vs_step": out / "tau_vs_step.png", **figures[best["checkpoint"]]},
    }  # fmt: skip
    return summary, payload


def run(cfg: EvalConfig) -> dict:
    """Score one checkpoint, or every checkpoint of a run folder; returns the report (or the runs summary)."""
    checkpoints = find_checkpoints(cfg.checkpoint)
    prompts = load_prompts(cfg.prompts, cfg.limit_per_category)
    if prompts.bad_rows:
        log.warning(
            "%s: skipped %d bad rows, e.g. %s", prompts.path, prompts.bad_rows, prompts.bad_examples[0]
        )
    ev, out = Evaluator(cfg, prompts), Path(cfg.out_dir)
    baselines: dict = {}
    if list(checkpoints) == [Path(cfg.checkpoint)]:  # the drafter and the baselines in the same rounds
        best = Path(cfg.checkpoint)
        res = ev.evaluate(best, checkpoints[best], out, tuple(cfg.baselines))
        summary = r = drafter = res["report"]
        baselines = res["baselines"]
        payload = {
            "history": [{"eval/tau": r["tau"], "eval/speedup": r["speedup"], "eval/efficiency": r["efficiency"]}],
            "table": (["category", "n", "tau", "speedup"],
                      [[k, c["n"], c["tau"], c["speedup"]] for k, c in r["categories"].items()]),
            "figures": res["figures"],
        }  # fmt: skip
    else:
        summary, payload = score_run_dir(ev, checkpoints, Path(cfg.checkpoint), out)
    if cfg.baselines and "checkpoints" in summary:  # beside the run's best drafter, on its backbone (in
        # rounds of their own: the drafter's figure is the one scored above)
        entry = next(e for e in summary["checkpoints"] if e["best"])
        best, drafter = Path(entry["checkpoint"]), json.loads(Path(entry["report"]).read_text())
        res = ev.evaluate(best, checkpoints[best], out, tuple(cfg.baselines), drafter=False)
        baselines = res["baselines"]
    if cfg.baselines:
        cmp = compare(drafter, baselines)
        write_compare(out, cmp)
        for b, w in cmp["wins"].items():
            log.info("%s %.3fx vs %s %.3fx: faster in %d of %d categories", drafter["method"],
                     drafter["speedup"] or 0, b, baselines[b]["speedup"] or 0, w["categories"], w["of"])  # fmt: skip
        summary = {**summary, "baselines": cmp}
    if cfg.logger.kind == "wandb":
        keys = ("checkpoint", "prompts", "method", "temperature", "max_new_tokens", "limit_per_category")
        config = {k: getattr(cfg, k) for k in keys}
        config |= {"dtype": ev.dtype_choice.record(), "machine": machine_facts(ev.device)}  # figures name it
        log_wandb(cfg.logger, out, f"eval-{out.name}", config, **payload)
    return summary
