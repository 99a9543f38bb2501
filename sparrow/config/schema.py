"""The configuration schema: one frozen dataclass per group of sparrow/conf/.

Every field has a default so that `sparrow train` runs with no arguments (the embedded
default: tiny built-in model, synthetic task, CPU). Each field's docstring (the string right
below it) is the one description of that key: the comments of sparrow/conf/*.yaml and the
tables of docs/configuration.md are generated from it (`python -m sparrow.config.describe
--write`; tests/config/test_describe.py fails when they drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    path: str = "builtin:tiny"
    """a local Hugging Face directory, or "builtin:tiny" for the embedded default model"""
    dtype: str = "auto"
    """weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"""
    device: str = "auto"
    """auto (cuda when available), cpu, cuda, cuda:N"""
    max_context: int = 0
    """longest total sequence (prompt + generation); 0 takes the model's own limit"""


@dataclass(frozen=True)
class RolloutConfig:
    backend: str = "native"
    """rollout engine (sparrow/engine/protocol.py): native (the project's engine) or vllm
    (vLLM 0.23 on GPUs, dense or block-sparse through the project's plugin; docs/backends.md)"""
    samples_per_prompt: int = 8
    """samples generated per prompt (the GRPO group size)"""
    max_new_tokens: int = 1024
    """generation cutoff in new tokens"""
    temperature: float = 1.0
    """sampling temperature; 0 means greedy"""
    top_p: float = 1.0
    """nucleus sampling mass; 1.0 keeps the whole distribution"""
    top_k: int = 0
    """keep only the k most likely tokens; 0 keeps all"""
    logprobs_topk: int = 20
    """top tokens and logprobs returned per generated token (the acceptance lower bound uses
    them)"""
    finish_fraction: float = 1.0
    """partial rollouts (docs/async.md): the step's batch closes once this share of its GRPO
    groups have every sample finished; the unfinished ones resume in the next step's rollout
    under its weights, which takes that many fewer new prompts. 1 waits for every sample"""
    kv_cache_mib: int = 256
    """KV cache memory per engine in MiB (used when gpu_memory_utilization is 0 or on CPU)"""
    gpu_memory_utilization: float = 0.0
    """on GPU: size the KV cache, at each rollout, so the device's used memory reaches this
    share of its total (vLLM's gpu_memory_utilization; native: the same size while it
    fits, docs/engine.md); 0 uses kv_cache_mib"""
    release_memory: bool = True
    """on GPU: free the KV cache between rollouts so scoring and the update have the memory"""
    ignore_eos: bool = False
    """keep generating past the model's eos tokens (benchmarks of fixed lengths)"""
    max_batch_size: int = 64
    """most sequences decoded at once by one engine"""
    seed: int = 0
    """base seed; each request derives its own"""
    num_actors: int = 0
    """rollout actors; 0 means one per GPU, or one on a machine without GPU"""
    placement: str = "colocated"
    """with a trainer group (trainer.num_workers > 0) on GPUs: colocated puts one engine on
    each trainer rank's GPU (the KV cache released while the trainer works, kept with
    pipeline.max_staleness=1); separate gives the engines GPUs of their own, where a
    one-step-off rollout runs beside the update (docs/async.md)"""
    work_item_prompts: int = 0
    """0: each engine takes prompts while it runs, its own share first, then those waiting
    behind a full engine (sparrow/runtime/rollout/dispatch.py); an engine without a feed (vLLM),
    or a single actor, gets its whole share as one item; N > 0: work items of N prompts handed
    to whichever actor is free"""
    overlap: bool = True
    """launch each decode step before the host has read the previous one's tokens (same results)"""
    centroid_dtype: str = "cache"
    """page centroids' dtype: cache (the KV cache's) or float8_e4m3fn (half the bytes page
    scoring reads; selection changes slightly, and calibration replays with this setting)"""
    programmatic_launch: str = "all"
    """GPU kernels launched with programmatic dependent launch (Hopper and later): all, none,
    linear (decode projections) or attention (norm + RoPE, scoring, top-k, attention)"""
    skinny_linear: bool = True
    """decode projections of up to 16 rows in the weight-streaming kernel; false uses cuBLAS"""
    fold_norms: bool = True
    """a decode layer's RMSNorms and residual adds folded into its projections' kernels"""
    keep_graphs: bool = True
    """keep the decode CUDA graphs while the engine sleeps and replay them after waking when
    its KV cache lies where it did (false: capture them again after every wake)"""


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = "tiny-0.86"
    """a preset name (sparrow schedule list), a calibrated schedule's name, or a YAML file path"""
    sparse: bool = True
    """false decodes densely (the baseline every sparse run is compared with)"""
    target: float = 0.86
    """acceptance p5 target per length bin; the run holds every bin to this value (a
    schedule's own target field only records what it was chosen for)"""
    target_statistic: str = "p5"
    """per-bin statistic held at the target: p5 (the paper's), p1, p10, mean, min, or
    share_below_half (lower is better: target is then the largest share allowed)"""
    selection: str = "centroid"
    """page-scoring rule (docs/selection.md): centroid, centroid_maxhead, quest, quest_maxhead,
    or oracle (teacher-forced replay only: calibrate.sample_sparse=false; never decodes)"""
    dense_heads: list[list[int]] = field(default_factory=list)
    """(layer, KV head) pairs that read every page on sparse layers, e.g. [[2, 0], [5, 3]]"""
    page_size: int = 0
    """tokens per KV page; 0 keeps the schedule's, else its token budgets in pages of this size"""


@dataclass(frozen=True)
class DistillConfig:
    enabled: bool = False
    """DistillSparse: a LoRA used only by the sparse actor, pulled toward the dense policy"""
    lora_rank: int = 16
    """LoRA rank"""
    lora_alpha: int = 32
    """LoRA scaling alpha (the update is scaled by alpha / rank)"""
    targets: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """projections that carry the LoRA (any of q_proj k_proj v_proj o_proj gate_proj up_proj
    down_proj)"""
    loss: str = "k3"
    """divergence: k3 (sampled-token estimate r - log r - 1, r = p_dense / p_sparse) or full_kl
    (exact KL(dense || sparse) over the vocabulary)"""
    kl_coef: float = 1.0
    """weight of the divergence in the LoRA loss"""
    ppo_coef: float = 0.0
    """weight of a PPO term (algo.loss on the sparse forward, the rollout as old policy); 0 off"""
    lr_scale: float = 5.0
    """LoRA learning rate = algo.lr x lr_scale (AdamW of its own)"""
    every: int = 1
    """update the LoRA every N steps (between, the engines keep the last one)"""
    measure: bool = True
    """also measure acceptance without the LoRA on the same tokens (one more sparse forward)"""
    switch_to_cheaper: bool = False
    """measure the LoRA on a schedule one notch cheaper (each bin one budget of the controller's
    grid lower; one more sparse forward) and let the controller switch to it once it holds
    schedule.target (docs/method.md, DistillSparse: 0.80 with the LoRA reaches 0.86's p5)"""
    switch_patience: int = 2
    """distill measurements in a row the cheaper schedule must hold the target before a switch"""
    switch_margin: float = 0.0
    """the cheaper schedule must reach target + this margin (the target statistic's axis)"""
    release_during_rollout: bool = True
    """free the distiller's base weights (the policy in the compute dtype) while the engines
    roll out; the next distill step rebuilds them from the trainer's weights, as it would"""
    selector_coef: float = 0.0
    """weight of the selector term: KL from the dense attention mass per page to the softmax of
    the schedule's page scores, on the LoRA forward (gives the LoRA a gradient toward picking
    the pages dense attention reads); 0 off"""
    selector_positions: int = 32
    """generated positions per sequence the selector term probes (evenly spaced)"""


@dataclass(frozen=True)
class CorrectionConfig:
    mis_cap: float = 2.0
    """masked IS (mis_token, mis_sequence): a token's / sequence's p_dense_old / p_actor above
    this cap masks it (instead of truncating it, as TIS does)"""
    icepop_low: float = 0.5
    """icepop: tokens whose p_dense_old / p_actor lies outside [icepop_low, icepop_high] are
    masked"""
    icepop_high: float = 5.0
    """icepop: upper bound of the kept band"""
    geo_low: float = 0.99
    """geo_mask: sequences whose geometric mean of p_dense_old / p_actor lies outside
    [geo_low, geo_high] are masked"""
    geo_high: float = 1.01
    """geo_mask: upper bound of the kept band"""


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = "grpo"
    """advantage estimator (registry name): grpo, rloo"""
    loss: str = "ppo_clip"
    """policy loss (registry name): ppo_clip (TIS), mis_token, mis_sequence, icepop, geo_mask"""
    eps_low: float = 0.2
    """lower clip range of the PPO ratio"""
    eps_high: float = 0.28
    """upper clip range of the PPO ratio"""
    tis_cap: float = 2.0
    """truncated importance sampling cap C on p_dense_old / p_actor; negative turns TIS off"""
    loss_agg: str = "token_mean"
    """loss aggregation: token_mean or sequence_mean"""
    adv_eps: float = 1.0e-6
    """epsilon added to the group std in GRPO"""
    lr: float = 3.0e-4
    """policy learning rate (AdamW): the embedded tiny model's; the paper's runs used 1e-6"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """gradient norm clip; 0 disables"""
    ppo_epochs: int = 1
    """optimizer passes over each step's rollouts"""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """thresholds of the masking mismatch corrections (algo.loss mis_*, icepop, geo_mask)"""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """DistillSparse settings (docs/distill.md)"""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop prompt groups whose samples all got the same reward (no GRPO
    signal) and draw more prompts until data.prompts_per_step informative groups are kept"""
    dynamic_sampling_max_draws: int = 4
    """dynamic sampling: most draws of data.prompts_per_step prompts in one step (the first one
    included); a batch still short after them is filled with uninformative groups"""
    overlong_buffer: int = 0
    """DAPO overlong shaping: over the last overlong_buffer tokens of rollout.max_new_tokens the
    reward falls linearly, by overlong_penalty at the limit; 0 turns it off"""
    overlong_penalty: float = 1.0
    """the overlong shaping's largest penalty (reached at rollout.max_new_tokens)"""
    mask_truncated: bool = False
    """leave samples cut at the length limit (finish_reason "length") out of the loss"""


@dataclass(frozen=True)
class DataConfig:
    train: str = "builtin:synthetic"
    """training prompts: a Parquet/JSONL path, or "builtin:NAME" for a synthetic task"""
    eval: str = ""
    """evaluation prompts (same forms); empty disables evaluation"""
    reward: str = "exact_match"
    """reward function: exact_match, math, module:function or path/to/file.py:function
    (docs/rewards.md)"""
    prompt_key: str = "prompt"
    """column holding the prompt text"""
    answer_key: str = "answer"
    """column holding the ground-truth answer"""
    prompts_per_step: int = 8
    """prompts per RL step"""
    max_prompt_tokens: int = 1024
    """longest prompt in tokens; a longer one is an error naming the row"""
    reward_timeout_s: float = 10.0
    """seconds one reward call may take before it scores 0"""
    reward_max_error_share: float = 0.5
    """share of a step's samples whose reward call may raise (each scores 0); more stops the run"""
    chat_template: str = "auto"
    """how chat-message prompts become text: auto (the model tokenizer's chat template), none,
    builtin:qwen3 or builtin:plain (sparrow/assets/chat_templates), or a Jinja file's path"""
    enable_thinking: bool | None = None
    """passed to the chat template as enable_thinking (Qwen3's switch); null: the template's
    default"""
    reward_by_source: dict[str, str] = field(default_factory=dict)
    """reward per data_source (community layout) as {pattern: reward}, fnmatch patterns tried in
    order; rows no pattern matches use data.reward"""
    format_reward: float = 0.0
    """math rewards: added to a sample that closes its thinking block and gives a final \\boxed{}"""


@dataclass(frozen=True)
class PipelineConfig:
    workdir: str = "./sparrow-work"
    """every run's files, the DuckDB file and the MLflow store live here"""
    run_id: str = ""
    """run id; empty makes a new one, an existing one resumes"""
    steps: int = 8
    """RL steps to run"""
    fail_at: str = ""
    """fail a stage on purpose, as STAGE@STEP (for testing resume); empty disables"""
    kill_at: str = ""
    """kill the process (SIGKILL) as STAGE@STEP, once the stage has written its files but before
    it is recorded (fault-injection tests); empty disables"""
    checkpoint_every: int = 0
    """checkpoint every K steps; 0 only at the end"""
    keep_checkpoints: int = 2
    """policy_update folders (full trainer state) that keep their tensors: the newest K; 0 all"""
    keep_every: int = 0
    """also keep the policy_update folder of every N-th step; 0 none beyond keep_checkpoints"""
    background_save: bool = True
    """on GPU: write each step's trainer state in the background, overlapping the next rollout"""
    eval_every: int = 0
    """evaluate every K steps; 0 never"""
    eval_temperature: float = 0.0
    """0: evaluate greedily (the policy's best answer); > 0: eval_samples samples per eval
    prompt at this temperature (the policy's sampled accuracy, which RL raises once greedy is
    right); dense"""
    eval_samples: int = 1
    """samples per evaluation prompt (the n of pass@k); more than 1 needs eval_temperature > 0"""
    eval_prompts: int = 0
    """evaluation prompts, rows 0.. of data.eval; 0: every row of a file, or
    data.prompts_per_step x rollout.samples_per_prompt rows of a built-in task"""
    eval_pass_k: list[int] = field(default_factory=list)
    """the k of the pass@k reported per data_source (each 1..eval_samples); empty: 1, 2, 4, ...
    below eval_samples, and eval_samples"""
    reoptimize_every: int = 0
    """re-optimize the schedule every K steps even without a threshold event; 0 never"""
    max_staleness: int = 0
    """policy versions a rollout may lag the update it feeds: 0 the synchronous step; 1
    one-step-off, the rollout of step n+1 starts from the weights of update n-1 before step n
    scores and updates, and is collected when step n+1 begins (docs/async.md)"""
    report: bool = True
    """at the end of the run, write its report (plots and summary.md, what `sparrow report`
    writes) into runs/<run_id>/report and MLflow's plots/; false skips it (a few seconds)"""
    mlflow_uri: str = ""
    """MLflow tracking URI; empty means sqlite:///<workdir>/mlflow.db"""
    seed: int = 0
    """base seed of the run (data order, sampling, initialisation)"""


@dataclass(frozen=True)
class CalibrateConfig:
    prompts: str = ""
    """calibration prompts (same forms as data.train); empty uses data.train"""
    num_prompts: int = 8
    """prompts sampled for calibration (rows 0.. of the dataset's order)"""
    repeats: int = 4
    """samples per prompt (the paper repeated each prompt 8 times)"""
    max_new_tokens: int = 0
    """new tokens per sample; 0 takes rollout.max_new_tokens"""
    sample_sparse: bool = True
    """true: each top-k of the grid is measured on the sparse actor's own samples under it
    (on-policy; predicts a train step's p5); false: on dense samples (one sampling run)"""
    topk_pages: list[int] = field(default_factory=list)
    """the grid of top-k pages replayed (was `budgets`); empty: the paper's steps 29..1149
    below the longest trajectory, or a small grid (1..64) when fewer than 4 of them fit"""
    min_bin_tokens: int = 500
    """the floor for a length bin's statistics to count (was `min_tokens`): fewer tokens than
    this, or fewer trajectories than min_bin_samples, and the bin is marked in bin_stats and
    reports (counted false) but left out of the worst bin, the threshold events and the
    controller; in calibration such a bin takes its neighbour's decision"""
    min_bin_samples: int = 8
    """the floor's trajectories: a bin reached by fewer distinct samples does not count"""
    num_bins: int = 0
    """bins of the calibrated schedule; 0 keeps schedule.name's count (more if trajectories
    reach further)"""
    name: str = ""
    """name of the calibrated schedule; empty names it calibrated-<model folder>-<target>"""
    hardware: str = "h200"
    """hardware preset of the cost model that prices each budget (sparrow costmodel --help)"""
    time_generation: bool = False
    """also time generating every budget of the grid (the paper's way) to compare with
    calibration"""


@dataclass(frozen=True)
class ControlConfig:
    tolerance: float = 0.0
    """a bin counts as below target when its p5 < schedule.target - tolerance"""
    patience: int = 1
    """steps in a row below target before a bin's budget is raised"""
    margin: float = 0.05
    """on the pipeline.reoptimize_every timer, bins whose p5 >= target + margin try a lower
    budget"""
    remeasure_samples: int = 4
    """trajectories replayed per re-measurement, the longest of the step's (every bin they
    reach keeps tokens); 0 replays all"""
    confirm_raise: bool = True
    """before a raise, re-measure the bin exactly at its current budget and raise only if it
    misses the target there: the trigger reads the top-k lower bound of acceptance, which a
    broad next-token distribution holds low at any budget; false raises on the trigger alone"""


@dataclass(frozen=True)
class TrainerConfig:
    num_workers: int = 0
    """trainer ranks as Ray actors (FSDP2, one GPU each; gloo on CPU); 0 keeps the trainer in
    the flow's own process (one GPU shared with the engine)"""
    sync_bucket_mib: int = 256
    """bucket size of the weight broadcast to the rollout engines, in MiB"""
    micro_batch_tokens: int = 8192
    """tokens per micro-batch in dense scoring and the update"""
    logits_chunk_tokens: int = 4096
    """tokens whose [tokens, vocab] logits exist at once in scoring and the update"""
    gradient_checkpointing: bool = False
    """recompute each layer's activations in the backward (long sequences fit; ~30% more work)"""
    offload_during_rollout: bool = False
    """on GPU: weights and optimizer moments go to host memory while the rollout runs"""
    master_weights: bool = True
    """with a compute dtype below fp32 (bf16 on GPU): the model holds bf16 parameters and
    AdamW steps fp32 master copies; false keeps fp32 parameters under autocast"""
    fused_norms: bool = False
    """one torch.rms_norm kernel per RMSNorm instead of transformers' elementwise chain
    (sparrow/trainer/fused_norms.py); off until measured on a GPU"""
    compile_layers: bool | None = None
    """torch.compile each decoder layer (sparrow/trainer/compiled_layers.py): fused elementwise
    work and less host overhead; null turns it on where the trainer runs on CUDA in one
    process, not in a trainer group (an H100 at 4 x 8K tokens: with compile_logprobs, scoring
    27% -> 44% MFU, the update 26% -> 43%)"""
    compile_logprobs: bool | None = None
    """the float32 log-softmax over each chunk of logits compiled, in scoring and the update
    (sparrow/trainer/logprobs.py: bf16 logits read once; the update's chunks keep only their
    normalizer and recompute the logits in the backward); null: as compile_layers"""


@dataclass(frozen=True)
class RayConfig:
    address: str = ""
    """Ray cluster address; empty starts a local Ray"""
    placement_strategy: str = "pack"
    """with a trainer group (trainer.num_workers > 0), how its Ray placement group (one bundle
    per rank, engine i in bundle i) spreads over the nodes: pack fills as few nodes as fit;
    strict_spread puts each rank and its engines on a node of its own (refused after 60 s
    when the cluster has fewer nodes than ranks); spread does so where it can. On GPUs it applies to
    rollout.placement=colocated; without GPUs pack reserves nothing (Ray's scheduler places
    each process) and the spreads make one engine per rank when rollout.num_actors is 0"""


@dataclass(frozen=True)
class SparrowConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """which checkpoint the policy, the rollout engine and the scorer load"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """engine, sampling and batch settings"""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """the sparsity schedule (KV pages per length bin) and its acceptance target"""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """advantages, policy loss, optimizer, DistillSparse"""
    data: DataConfig = field(default_factory=DataConfig)
    """prompts, answers and the reward function"""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """workdir, run id, steps, tracking"""
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    """sparrow calibrate's prompts, top-k grid and cost model"""
    control: ControlConfig = field(default_factory=ControlConfig)
    """the online controller's thresholds (the reoptimize_schedule stage)"""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """where the trainer runs (in the flow's process or as a group of ranks) and how: micro-batch
    sizes, memory savers, compilation"""
    ray: RayConfig = field(default_factory=RayConfig)
    """the Ray cluster (no group file: set it on the command line)"""


# groups whose YAML file is chosen by sparrow/conf/config.yaml's defaults (or `group=name`
# overrides)
GROUPS = (
    "model",
    "rollout",
    "schedule",
    "algo",
    "data",
    "pipeline",
    "calibrate",
    "control",
    "trainer",
)

# fields with a closed set of values; names from registries are checked in load.py
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "rollout.backend": ("native", "vllm"),
    "rollout.placement": ("colocated", "separate"),
    "ray.placement_strategy": ("pack", "spread", "strict_spread"),
    "rollout.centroid_dtype": ("cache", "float8_e4m3fn"),
    "rollout.programmatic_launch": ("all", "none", "linear", "attention"),
    "algo.loss_agg": ("token_mean", "sequence_mean"),
    "algo.distill.loss": ("k3", "full_kl"),
}
