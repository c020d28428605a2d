"""Traces for `mlopt plan schedule`: a DLRM-like hybrid-parallel model, an FSDP transformer and a data-parallel CNN,
each one rank's training step of a 2 x 8-GPU job (16 ranks), written as mlopt traces.

    python examples/schedule/models.py OUT_DIR      # writes OUT_DIR/{dlrm,fsdp,cnn}.trace.json

They are synthetic on purpose: the shapes follow the Syndicate paper's workloads (section 6.2, Table 2, Fig. 15),
the compute times are assumptions of the order of a V100/A100 step (stated per model below), and every tensor
read and written is declared so that `mlopt.sim.workload.from_trace` derives the dependencies (and the
loop-carried ones, e.g. the next batch's data-prep all-to-all may start once this batch's embedding lookup has
read the features it overwrites). Deterministic: the same command writes the same bytes.

DLRM-like (model parallel embeddings, data parallel MLPs; the paper's A1-A3 family, scaled down):
  a2a-data-prep (sparse features to the ranks owning the tables, 64 MiB per rank) -> embedding lookup ->
  a2a-emb-fwd (pooled embeddings, 192 MiB) ; bottom MLP forward (8 layers) ; interaction ; top MLP forward
  (4 layers) ; loss ; top MLP backward -> ar-top-mlp (2 buckets of 4 MiB) ; interaction backward ->
  a2a-emb-bwd (192 MiB) -> embedding update ; bottom MLP backward -> ar-bottom-mlp (4 buckets of 128 MiB: the
  wide bottom MLP, as in the paper) ; optimizer step (waits for both all-reduces). Sizes: see the constants.
FSDP transformer (the paper's A4/A5 paradigm): 12 layers of 48 MiB of parameters, all-gather before each layer's
  forward and again before its backward, reduce-scatter of its gradient after its backward, optimizer on the shards.
Data-parallel CNN (the paper's A6, RegNet-like): 16 stages, DDP buckets of ~25 MiB all-reduced as the backward
  produces them (last layers first), optimizer step at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mlopt.formats.trace import CommSpec, Implementation, ModelTrace, Op, ProcessGroup, Tensor

MiB = 1 << 20
WORLD = 16  # 2 nodes x 8 GPUs: run on --topology dgx-a100x2
# DLRM-like sizes per rank (nccl-tests convention) at the scale of the paper's model A2 (Table 2: ~1000 tables of
# average dimension 93, average pooling 15, local batch 1024, MLP layers of ~3400): pooled embeddings
# 1024 x 1000 x 93 x 2 B (fp16) ~ 182 MiB; sparse indices 1024 x 1000 x 15 x 4 B ~ 59 MiB; the wide bottom MLP
# (the paper: all-reduces of 100s of MB) 8 layers of 64 MiB, the top MLP 4 layers of 2 MiB.
DATA_PREP_BYTES = 64 * MiB  # sparse indices of the next batch
EMBEDDING_BYTES = 192 * MiB  # pooled embeddings (forward) and their gradients (backward)
TOP_BUCKET_BYTES = 4 * MiB  # two top-MLP layers per DDP bucket
BOTTOM_BUCKET_BYTES = 128 * MiB  # two bottom-MLP layers per bucket
# Compute (us), assumed for an A100: A2's 638 MFLOP per sample x 1024 samples x 3 (forward + backward) ~ 2 TFLOP
# per iteration at ~130 TFLOP/s ~ 15 ms, spread over the layers below.
LOOKUP_US, BOTTOM_FWD_US, TOP_FWD_US, INTERACTION_US = 1000, 400, 200, 300


class _Builder:
    """Appends ops in issue order; tensors are named and created on first use."""

    def __init__(self, name: str, world: int = WORLD):
        self.name = name if world == WORLD else f"{name}_{world}ranks"  # the traces keep their names
        self.world = world
        self.ops: list[Op] = []
        self.tensors: dict[str, Tensor] = {}

    def tensor(self, name: str, nbytes: int, kind: str = "activation") -> int:
        if name not in self.tensors:
            self.tensors[name] = Tensor(len(self.tensors), nbytes, kind, dtype="float32")
        return self.tensors[name].id

    def compute(self, name: str, role: str, us: float, reads: list[int], writes: list[int]) -> None:
        self.ops.append(Op(len(self.ops), name, role, tuple(reads), tuple(writes),
                           (Implementation("default", float(us)),)))

    def comm(self, name: str, collective: str, nbytes: int, reads: list[int], writes: list[int],
             group: str = "world") -> None:
        self.ops.append(Op(len(self.ops), name, "comm", tuple(reads), tuple(writes),
                           (Implementation("default", 0.0),), comm=CommSpec(collective, nbytes, group)))

    def trace(self) -> ModelTrace:
        return ModelTrace(self.name, tuple(self.ops), tuple(self.tensors.values()),
                          (ProcessGroup("world", tuple(range(self.world))),), rank=0, world_size=self.world,
                          source={"generator": "examples/schedule/models.py"})


def dlrm_like(bytes_scale: float = 1.0, world: int = WORLD) -> ModelTrace:
    """Sizes and compute times: the constants above (backward = 2 x forward); `bytes_scale` multiplies every
    communicated size (bench/enforcer.py runs a scaled copy through the CPU runtime). `world`: ranks (8 per
    node); the per-rank sizes do not change with it (local batch, tables per rank x ranks), as in the paper's
    weak scaling (its Fig. 12), so more nodes send a larger share of every all-to-all across nodes."""
    b = _Builder("dlrm_like" if bytes_scale == 1.0 else f"dlrm_like_x{bytes_scale:g}", world)

    def sized(nbytes: int) -> int:  # whole 64-byte units, so every block of `world` ranks stays float32-aligned
        return max(64 * world, int(nbytes * bytes_scale) // (64 * world) * (64 * world))

    raw = b.tensor("raw_batch", 16 * MiB, "input")
    feats = b.tensor("sparse_features", 16 * MiB)
    b.comm("a2a-data-prep", "alltoall", sized(DATA_PREP_BYTES), [raw], [feats])
    lookups = b.tensor("lookups", 32 * MiB)
    tables = b.tensor("embedding_tables", 512 * MiB, "parameter")
    b.compute("embedding_lookup", "forward", LOOKUP_US, [feats, tables], [lookups])
    pooled = b.tensor("pooled_embeddings", 32 * MiB)
    b.comm("a2a-emb-fwd", "alltoall", sized(EMBEDDING_BYTES), [lookups], [pooled])
    x = b.tensor("dense_input", 4 * MiB, "input")
    bottom = [b.tensor(f"bottom_w{i}", 16 * MiB, "parameter") for i in range(8)]
    acts = []
    for i, w in enumerate(bottom):
        out = b.tensor(f"bottom_a{i}", 4 * MiB)
        b.compute(f"bottom_mlp_fwd{i}", "forward", BOTTOM_FWD_US, [x, w], [out])
        acts.append(out)
        x = out
    inter = b.tensor("interaction", 8 * MiB)
    b.compute("interaction_fwd", "forward", INTERACTION_US, [x, pooled], [inter])
    top = [b.tensor(f"top_w{i}", 2 * MiB, "parameter") for i in range(4)]
    y = inter
    for i, w in enumerate(top):
        out = b.tensor(f"top_a{i}", 2 * MiB)
        b.compute(f"top_mlp_fwd{i}", "forward", TOP_FWD_US, [y, w], [out])
        y = out
    grad = b.tensor("grad_top_out", 2 * MiB)
    b.compute("loss", "forward", 100, [y], [grad])
    top_grads = []
    for i in reversed(range(4)):
        gw = b.tensor(f"top_gw{i}", 2 * MiB, "gradient")
        gin = b.tensor(f"top_ga{i}", 2 * MiB)
        b.compute(f"top_mlp_bwd{i}", "backward", 2 * TOP_FWD_US, [grad, top[i]], [gw, gin])
        top_grads.append(gw)
        grad = gin
        if i % 2 == 0:  # DDP bucket: two layers' gradients
            b.comm(f"ar-top-mlp{i // 2}", "allreduce", sized(TOP_BUCKET_BYTES), top_grads[-2:], top_grads[-2:])
    g_pooled = b.tensor("grad_pooled", 32 * MiB)
    g_bottom = b.tensor("grad_bottom_out", 4 * MiB)
    b.compute("interaction_bwd", "backward", 2 * INTERACTION_US, [grad, pooled, x], [g_pooled, g_bottom])
    g_lookups = b.tensor("grad_lookups", 32 * MiB)
    b.comm("a2a-emb-bwd", "alltoall", sized(EMBEDDING_BYTES), [g_pooled], [g_lookups])
    bottom_grads = []
    grad = g_bottom
    for i in reversed(range(8)):
        gw = b.tensor(f"bottom_gw{i}", 16 * MiB, "gradient")
        gin = b.tensor(f"bottom_ga{i}", 4 * MiB)
        b.compute(f"bottom_mlp_bwd{i}", "backward", 2 * BOTTOM_FWD_US, [grad, bottom[i], acts[i]], [gw, gin])
        bottom_grads.append(gw)
        grad = gin
        if i % 2 == 0:
            b.comm(f"ar-bottom-mlp{i // 2}", "allreduce", sized(BOTTOM_BUCKET_BYTES), bottom_grads[-2:], bottom_grads[-2:])
    b.compute("embedding_update", "optimizer", LOOKUP_US, [g_lookups, tables], [tables])
    b.compute("mlp_optimizer", "optimizer", 800, top_grads + bottom_grads + top + bottom, top + bottom)
    return b.trace()


def fsdp_like(layers: int = 12, param_bytes: int = 48 * MiB, world: int = WORLD) -> ModelTrace:
    """A transformer layer of 48 MiB parameters: 2.5 ms forward, 5 ms backward per layer (assumed)."""
    b = _Builder("fsdp_like", world)
    shards = [b.tensor(f"shard{i}", param_bytes // world, "parameter") for i in range(layers)]
    x = b.tensor("input", 8 * MiB, "input")
    acts = []
    for i in range(layers):
        full = b.tensor(f"full_w{i}", param_bytes)
        b.comm(f"ag-fwd{i}", "allgather", param_bytes, [shards[i]], [full])
        out = b.tensor(f"act{i}", 8 * MiB)
        b.compute(f"layer_fwd{i}", "forward", 2500, [x, full], [out])
        acts.append(x)
        x = out
    grad = b.tensor("grad_out", 8 * MiB)
    b.compute("loss", "forward", 200, [x], [grad])
    grads = []
    for i in reversed(range(layers)):
        full = b.tensor(f"full_w{i}_bwd", param_bytes)
        b.comm(f"ag-bwd{i}", "allgather", param_bytes, [shards[i]], [full])
        gw = b.tensor(f"grad_w{i}", param_bytes, "gradient")
        gin = b.tensor(f"grad_act{i}", 8 * MiB)
        b.compute(f"layer_bwd{i}", "backward", 5000, [grad, full, acts[i]], [gw, gin])
        gs = b.tensor(f"grad_shard{i}", param_bytes // world, "gradient")
        b.comm(f"rs-grad{i}", "reducescatter", param_bytes, [gw], [gs])
        grads.append(gs)
        grad = gin
    b.compute("optimizer", "optimizer", 1000, grads + shards, shards)
    return b.trace()


def cnn_dp(stages: int = 16, world: int = WORLD) -> ModelTrace:
    """A RegNet-like CNN: 16 stages of 6.25 MiB of parameters (100 MiB in all), 1.2 ms forward and 2.4 ms
    backward per stage (assumed); DDP buckets of 25 MiB (4 stages) all-reduced in backward order."""
    b = _Builder("cnn_dp", world)
    weights = [b.tensor(f"w{i}", 25 * MiB // 4, "parameter") for i in range(stages)]
    x = b.tensor("images", 64 * MiB, "input")
    acts = []
    for i, w in enumerate(weights):
        out = b.tensor(f"act{i}", 32 * MiB)
        b.compute(f"stage_fwd{i}", "forward", 1200, [x, w], [out])
        acts.append(x)
        x = out
    grad = b.tensor("grad_out", 32 * MiB)
    b.compute("loss", "forward", 200, [x], [grad])
    bucket: list[int] = []
    grads = []
    for i in reversed(range(stages)):
        gw = b.tensor(f"gw{i}", 25 * MiB // 4, "gradient")
        gin = b.tensor(f"ga{i}", 32 * MiB)
        b.compute(f"stage_bwd{i}", "backward", 2400, [grad, weights[i], acts[i]], [gw, gin])
        bucket.append(gw)
        grads.append(gw)
        grad = gin
        if len(bucket) == 4:
            b.comm(f"ar-bucket{len(grads) // 4 - 1}", "allreduce", 25 * MiB, bucket, bucket)
            bucket = []
    b.compute("optimizer", "optimizer", 1500, grads + weights, weights)
    return b.trace()


MODELS = {"dlrm": dlrm_like, "fsdp": fsdp_like, "cnn": cnn_dp}


def write_all(out_dir: str | Path, world: int = WORLD) -> dict[str, Path]:
    """Writes OUT_DIR/<name>.trace.json for every model on `world` ranks (atomically); returns the paths."""
    from mlopt.formats.io import write_json

    out = Path(out_dir)
    paths = {}
    for name, make in MODELS.items():
        paths[name] = out / f"{name}.trace.json"
        write_json(paths[name], make(world=world).to_dict())
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/schedule/models.py OUT_DIR")
    for path in write_all(sys.argv[1]).values():
        print(path)
