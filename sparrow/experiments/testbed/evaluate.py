"""Held-out accuracy of the testbed model at the full chain length: teacher-forced (exact for
greedy, the expected value for sampling) and sampled with the project's rollout engine.

    from sparrow.experiments.testbed.evaluate import sampled_accuracy, teacher_forced_accuracy
    tf = teacher_forced_accuracy(hf_model, examples)    # greedy, sampled_estimate, hop
    hop = stage_hop_accuracy(hf_model, stage, prompts=8, seed=0)   # the curriculum's check
    sampled = sampled_accuracy("/tmp/sparrow-testbed", examples, samples=4, seed=0)

Teacher forcing reads each reference sequence once. A chain is a single path through one
cycle, so a completion reaches the answer (up to a wrong hop undone by chance later) only by
reproducing the reference; hence greedy decoding is right exactly when every teacher-forced
argmax is the reference token, and sampling at temperature 1 is right with the product of
the reference tokens' probabilities. Both come from one forward pass per prompt instead of
thousands of decode steps. `hop` is the mean, over the hop lines, of the probability of
sampling the whole line right given a right prefix. Tags (multi_chase's benign tokens) are
left out of every figure: any defined name is right there. With K chains the sampled
figure is the expected graded reward: the mean over chains of the product of the chain's
hop lines' probabilities, the answer line's shared evenly (an estimate: it takes a chain's
answer as right when its own lines are; for K = 1 it is exact, as before). The sampled figure
grades what the engine generates at temperature 1, on fewer prompts, by the share of chains
whose hop lines and answer are all right (`accuracy`); the RL reward (share_match, reading the
answer line alone) is `answer_share` beside it: on v2's sizes each chain ends on the next
one's start, so a model can copy the answer from the query line without a single lookup.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from sparrow.data.multi_chase import parse_prompt, verified_share
from sparrow.data.synthetic import Example
from sparrow.data.token_roles import ReferencePath
from sparrow.experiments.testbed.adaptive import StageEnd
from sparrow.experiments.testbed.data import (
    Stage,
    derived_seed,
    encode,
    held_out_examples,
    token_ids,
    vocab,
)


def precision(device: torch.device):
    """bf16 autocast on CUDA (weights stay fp32); plain fp32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def teacher_forced_accuracy(model: torch.nn.Module, examples: list[Example], rows: int = 8) -> dict:
    """{"greedy", "sampled_estimate", "hop", "sampled_estimate_by_hops", "argmax_by_role"} over
    `examples` (all of one length); "sampled_estimate_by_hops" maps k to the mean probability
    of sampling the first k hop lines right: about the sampled accuracy of a k-hop chain (to
    pick a length RL can work at); "argmax_by_role", the share of the reference's lookup,
    local and answer tokens that are the model's argmax (which part of a hop line fails)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    greedy, lines = [], []
    by_role: dict[str, list[bool]] = {}
    newline = vocab()["\n"]
    chains = len(parse_prompt(examples[0].prompt).starts) if examples else 1
    for start in range(0, len(examples), rows):
        chunk = examples[start : start + rows]
        ids, mask = encode(chunk)
        ids = ids.to(device)
        with precision(device):
            logits = model(input_ids=ids).logits[:, :-1].float()
        target = ids[:, 1:]
        token_logp = torch.log_softmax(logits, -1).gather(-1, target[..., None])[..., 0].cpu()
        hit = (logits.argmax(-1) == target).cpu()
        # the completion's characters: the eos after them decides nothing the reward reads
        completion = mask[:, 1:].clone()
        completion[:, -1] = False
        for row, example in enumerate(chunk):
            roles = _roles(example, completion.shape[1])
            free = torch.tensor([role == "benign" for role in roles], dtype=torch.bool)
            for role, right in zip(roles, hit[row].tolist()):
                if role in ("lookup", "local", "answer"):
                    by_role.setdefault(role, []).append(right)
            greedy.append(float((hit[row] | free)[completion[row]].all()))
            logp = token_logp[row].masked_fill(free, 0.0)
            lines.append(
                line_logps(target[row][completion[row]].cpu(), logp[completion[row]], newline)
            )
    model.train(was_training)
    per_line = torch.stack(lines) if lines else torch.zeros(0, 1, dtype=torch.float64)
    hops = (per_line.shape[1] - 1) // chains  # per chain; the last line is the answer
    prefix = _by_chain(per_line, chains).cumsum(1).exp().mean(2)
    whole = graded_estimate(per_line, chains)
    marks = sorted({max(1, round(hops * share)) for share in (1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)})
    return {
        "greedy": _mean(greedy),
        "sampled_estimate": _mean(whole.tolist()),
        "hop": _mean(per_line[:, :-1].exp().mean(1).tolist()) if hops else 1.0,
        "sampled_estimate_by_hops": {k: _mean(prefix[:, k - 1].tolist()) for k in marks if hops},
        "argmax_by_role": {role: _mean(hits) for role, hits in sorted(by_role.items())},
    }


def _roles(example: Example, length: int) -> list[str]:
    """The role (multi_chase ROLES) of each target (ids[1:]) of the example's reference
    sequence; "" on the prompt and the eos. Tags ("benign"): any defined name is right."""
    path = ReferencePath.of(example.prompt, token_ids)
    prompt = len(token_ids(example.prompt))
    roles = [""] * length
    if path is not None:
        roles[prompt - 1 : prompt - 1 + len(path.roles)] = path.roles
    return roles[:length]


def stage_hop_accuracy(model: torch.nn.Module, stage: Stage, prompts: int, seed: int) -> float:
    """Teacher-forced hop accuracy on `prompts` held-out prompts of the stage's sizes (the
    "stage-eval" stream): the cheap check of the adaptive curriculum, one forward a prompt."""
    examples = held_out_examples(
        stage.num_defs, stage.num_hops, prompts, seed, "stage-eval", stage.chains, stage.tags
    )
    return teacher_forced_accuracy(model, examples)["hop"]


def stage_record(
    model: torch.nn.Module,
    ended: StageEnd | None,
    steps_done: int,
    loss,
    stages: Sequence[Stage],
    prompts: int,
    seed: int,
) -> dict:
    """One entry of training_info's stage_eval (stage numbered from 1, or "end" after the
    last step): the stage-length hop accuracy of the check that ended the stage, the
    full-length one measured now on `prompts` prompts, and the running loss."""
    full = stage_hop_accuracy(model, stages[-1], prompts, seed)
    record = {
        "stage": "end" if ended is None else ended.stage + 1,
        "num_hops": stages[-1 if ended is None else ended.stage].num_hops,
        "reason": "end" if ended is None else ended.reason,
        "steps_done": steps_done,
        "hop_accuracy_stage_length": full if ended is None else ended.hop_accuracy,
        "hop_accuracy_full_length": full,
        "loss": None if loss is None else round(float(loss), 4),
    }
    print(f"stage_eval {record}", flush=True)
    return record


def _mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def _by_chain(per_line: torch.Tensor, chains: int) -> torch.Tensor:
    """[prompts, hop, chain] of the hop lines' logps: line i is hop i // chains of chain
    i % chains (the last line, the answer, left out)."""
    hops = (per_line.shape[1] - 1) // chains
    return per_line[:, :-1].reshape(len(per_line), hops, chains)


def graded_estimate(per_line: torch.Tensor, chains: int) -> torch.Tensor:
    """[prompts] expected graded reward at temperature 1 from each line's logp [prompts,
    lines] (line_logps; the answer line last): the mean over chains of the product of the
    chain's hop lines' probabilities, the answer line's shared evenly (module doc)."""
    return (_by_chain(per_line, chains).sum(1) + per_line[:, -1:] / chains).exp().mean(1)


def line_logps(completion_ids: torch.Tensor, logp: torch.Tensor, newline: int) -> torch.Tensor:
    """Sum of the token logps of each line of the completion (a line's "\n" belongs to it)."""
    ends = (completion_ids == newline).long()
    line = torch.cumsum(ends, 0) - ends
    per_line = torch.zeros(int(line[-1]) + 1, dtype=torch.float64)
    return per_line.index_add_(0, line, logp.double())


def sampled_accuracy(
    model_dir: str | Path,
    examples: list[Example],
    samples: int,
    seed: int,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Mean sampled_grade (and share_match: answer_share) of `samples` engine samples per
    prompt (temperature 1, dense decode); the checkpoint is read from model_dir as the RL flow reads it."""
    from sparrow.data.rewards import share_match_reward
    from sparrow.engine import Engine, EngineConfig, SamplingParams
    from sparrow.model import load_model, load_tokenizer

    device = torch.device(device)
    started = time.monotonic()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer.encode(example.prompt) for example in examples]
    new_tokens = max(len(example.completion) for example in examples) + 8
    longest = max(map(len, prompts)) + new_tokens
    sequences = len(examples) * samples
    # exactly the pages every sample can need, so no memory guess is involved
    config = EngineConfig(
        max_batch_size=sequences,
        num_pages=sequences * (longest // 16 + 2),
        max_context=longest,
        seed=seed,
    )
    engine = Engine(load_model(model_dir, dtype=dtype, device=device), tokenizer, config)
    params = [
        SamplingParams(
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            n=samples,
            seed=derived_seed(seed, "sampled-eval", index),
            logprobs_topk=1,
        )
        for index in range(len(examples))
    ]
    results = engine.generate(prompts, params)
    pairs = [
        (example, sample.text or "")
        for example, group in zip(examples, results)
        for sample in group
    ]
    grades = [sampled_grade(example, text) for example, text in pairs]
    answer_shares = [share_match_reward(text, example.answer) for example, text in pairs]
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "accuracy": _mean(grades),
        "answer_share": _mean(answer_shares),
        "prompts": len(examples),
        "samples": samples,
        "seconds": round(time.monotonic() - started, 1),
    }


def sampled_grade(example: Example, text: str) -> float:
    """The grade of one engine sample of `example` in sampled_accuracy: the share of chains
    whose hop lines and answer are all right (multi_chase.verified_share), not share_match,
    which credits an answer copied from the query line past made-up hops."""
    return verified_share(example.prompt, text)
