# issue 39's mechanics at the Qwen3-1.7B shape (random weights, vocabulary 151,936) on one GPU:
# community-layout math set through the chat template, math reward, dynamic sampling, overlong
# shaping, evaluation every 2 steps, checkpoint, export, and the export's logits in transformers
export PYTHONPATH=/tmp/site:/tmp/r39
sparrow() { python -c "import sys; from sparrow.cli.main import main; sys.exit(main(sys.argv[1:]))" "$@"; }
rm -rf /tmp/dw /tmp/run /tmp/w39 /tmp/exp39 /tmp/r39 && df -h /tmp && mkdir -p /tmp/r39 && cp -r . /tmp/r39 && cd /tmp/r39
T0=$(date +%s)
python - <<'PY'
import sys
import os
if os.path.exists("/tmp/m17/config.json"): sys.exit(0)
sys.path.insert(0, "benchmarks")
from rl_step import SHAPE_17B
from sparrow.model.random_checkpoint import make_random_checkpoint
print(make_random_checkpoint("/tmp/m17", "qwen3", seed=0, **SHAPE_17B))
PY
echo "model made at $(( $(date +%s) - T0 ))s"
sparrow train model=qwen3_math schedule=qwen3_math rollout=qwen3_math algo=qwen3_math \
  data=qwen3_math pipeline=qwen3_math model.path=/tmp/m17 pipeline.workdir=/tmp/w39 \
  pipeline.run_id=m39 pipeline.steps=4 pipeline.eval_every=2 pipeline.checkpoint_every=2 \
  pipeline.eval_samples=2 pipeline.keep_checkpoints=1 data.prompts_per_step=8 rollout.max_new_tokens=512 \
  algo.dynamic_sampling=true algo.dynamic_sampling_max_draws=2 algo.overlong_buffer=128 \
  > $OUT/train39.log 2>&1; echo "train rc=$? at $(( $(date +%s) - T0 ))s"
tail -n 25 $OUT/train39.log
sparrow query --workdir /tmp/w39 --csv "SELECT step, name, value FROM step_metrics WHERE name LIKE 'dynamic/%' OR name LIKE 'eval/%' OR name LIKE 'time/%' OR name LIKE 'reward%' ORDER BY step, name" > $OUT/metrics39.csv 2>&1
sparrow query --workdir /tmp/w39 --csv "SELECT * FROM eval_results ORDER BY ALL" > $OUT/eval39.csv 2>&1
python - <<'PY' > $OUT/prompt39.txt 2>&1
import glob, pyarrow.parquet as pq
f = sorted(glob.glob("/tmp/w39/runs/m39/step-1/rollout/rollouts.parquet"))
t = pq.read_table(f[0]).to_pylist()
print(f[0], len(t), "rows; columns", list(t[0]))
print(repr(t[0]["prompt_text"][:400])); print(t[0].get("data_source"), t[0].get("extra_info"))
PY
sparrow export m39 /tmp/exp39 --workdir /tmp/w39 > $OUT/export39.log 2>&1; echo "export rc=$?"
python - <<'PY' 2>&1 | tee $OUT/logits39.json
import json, torch
from transformers import AutoModelForCausalLM
from sparrow.config.schema import AlgoConfig
from sparrow.trainer.export import find_policy_folder
from sparrow.trainer.policy_trainer import PolicyTrainer
src = find_policy_folder("/tmp/w39", "m39")
trainer = PolicyTrainer.load(src, AlgoConfig(), device="cuda", dtype="float32")
exported = AutoModelForCausalLM.from_pretrained("/tmp/exp39", dtype=torch.bfloat16).cuda()
ids = torch.randint(0, 151936, (1, 512), generator=torch.Generator().manual_seed(0)).cuda()
with torch.no_grad():
    want = trainer.model(ids).logits.float()
    rounded = {n: p.detach().to(torch.bfloat16) for n, p in trainer.model.named_parameters()}
    diff_w = max(float((rounded[n].float() - p.float()).abs().max()) for n, p in exported.named_parameters() if n in rounded)
    got = exported.float()(ids).logits.float()
rel = float((got - want).abs().max() / want.abs().max())
top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
print(json.dumps({"source": str(src), "weights_max_abs_diff_vs_bf16_rounded_trainer": diff_w,
                  "logits_max_rel_diff_vs_fp32_trainer": rel, "top1_agreement": top1,
                  "export_config_dtype": json.load(open("/tmp/exp39/config.json")).get("dtype")}))
PY
ls /tmp/exp39; echo "all done at $(( $(date +%s) - T0 ))s"
