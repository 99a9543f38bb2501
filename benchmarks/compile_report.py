"""Compile every Triton kernel for Hopper (sm_90) without a GPU and print the compiler's
resource report: registers, shared memory, spills. Catches compile errors before any device
time is spent, and says whether loads were vectorised (16-byte ld.global in the PTX).

    TRITON_INTERPRET=0 python benchmarks/compile_report.py

Runs where triton is installed (its bundled ptxas does the assembly); the configurations are
the launchers' defaults at the benchmark shapes (head dim 128, 16-token pages, bf16).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sparrow.kernels import kv_write, linear, page_scores, page_topk, paged_decode, split_combine

# strides that are not multiples of 16 elements at the benchmark shapes
UNALIGNED = {"s_cb"}


def signature(fn, types):
    names = fn.arg_names
    return {name: types.get(name, "i32") for name in names}


def build(kernel, types, constexprs, num_warps=4, num_stages=2):
    fn = kernel if isinstance(kernel, triton.runtime.JITFunction) else kernel.fn
    sig = signature(fn, types)
    for name in constexprs:
        sig[name] = "constexpr"
    # what the JIT specialises at run time: 16-byte aligned pointers, strides divisible by 16
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if name.endswith("_ptr")
        or (name.startswith("s_") and name not in UNALIGNED)
        or name in ("dim", "k_len", "k_per_split")
    }
    src = ASTSource(
        fn,
        signature=sig,
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        attrs=aligned,
    )
    return triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=num_warps, num_stages=num_stages),
    )


def report(name, compiled):
    ptx = compiled.asm["ptx"]
    wide = len(re.findall(r"(?:ld|cp\.async)\.[^\n]*(?:v4\.b32|\.L2::128B|, 16;|, 16,)", ptx))
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        info = subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True,
            text=True,
        )
    text = info.stdout + info.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    print(
        f"{name:36s} regs {regs.group(1) if regs else '?':>4} spill stores "
        f"{spills.group(1) if spills else '?':>4} B  shared {compiled.metadata.shared:6d} B  "
        f"16-byte loads {wide}"
    )


def main() -> int:
    ptr = lambda t: "*" + t
    decode_types = dict(
        q_ptr=ptr("bf16"),
        k_ptr=ptr("bf16"),
        v_ptr=ptr("bf16"),
        table_ptr=ptr("i32"),
        ntok_ptr=ptr("i32"),
        list_ptr=ptr("i32"),
        count_ptr=ptr("i32"),
        part_o_ptr=ptr("fp32"),
        part_lse_ptr=ptr("fp32"),
        qk_scale="fp32",
    )
    for group in (2, 4):
        for sparse in (False, True):
            for per_block in (4, 8):
                consts = dict(
                    GROUP=group,
                    BLOCK_G=16,
                    BLOCK_D=128,
                    PAGE=16,
                    PAGES_PER_BLOCK=per_block,
                    NUM_SPLITS=8,
                    SPARSE=sparse,
                    IEEE=False,
                    EVEN_D=True,
                    PREFETCH_IDS=False,
                    PDL=False,
                )
                report(
                    f"paged_decode G={group} sparse={sparse} ppb={per_block}",
                    build(paged_decode._paged_decode_kernel, decode_types, consts),
                )
    report(
        "split_combine",
        build(
            split_combine._combine_kernel,
            dict(part_o_ptr=ptr("fp32"), part_lse_ptr=ptr("fp32"), out_ptr=ptr("bf16")),
            dict(BLOCK_S=8, BLOCK_D=128, PDL=False),
        ),
    )
    report(
        "page_scores",
        build(
            page_scores._page_scores_kernel,
            dict(
                q_ptr=ptr("bf16"),
                cent_ptr=ptr("fp32"),
                table_ptr=ptr("i32"),
                ntok_ptr=ptr("i32"),
                score_ptr=ptr("fp32"),
            ),
            dict(
                GROUP=2,
                BLOCK_H=8,
                BLOCK_D=128,
                BLOCK_P=16,
                PAGE=16,
                BLOCKS_PER_PROGRAM=1,
                NUM_STAGES=1,
                PDL=False,
            ),
        ),
    )
    for width, warps in ((1024, 4), (2048, 8), (4096, 8)):
        report(
            f"page_topk W={width}",
            build(
                page_topk._page_topk_kernel,
                dict(
                    score_ptr=ptr("fp32"),
                    ntok_ptr=ptr("i32"),
                    topk_ptr=ptr("i32"),
                    list_ptr=ptr("i32"),
                    count_ptr=ptr("i32"),
                    mask_ptr=ptr("i32"),
                ),
                dict(PAGE=16, BOS=1, EOS=2, BLOCK_W=width, WRITE_MASK=False, RADIX=4, PDL=False),
                num_warps=warps,
            ),
        )
    report(
        "kv_write fused",
        build(
            kv_write._kv_write_kernel,
            dict(
                k_ptr=ptr("bf16"),
                v_ptr=ptr("bf16"),
                kc_ptr=ptr("bf16"),
                vc_ptr=ptr("bf16"),
                cent_ptr=ptr("fp32"),
                slot_ptr=ptr("i64"),
            ),
            dict(PAGE=16, BLOCK_D=128, FUSE=True),
            num_warps=1,
        ),
    )
    linear_types = dict(
        x_ptr=ptr("bf16"),
        w_ptr=ptr("bf16"),
        b_ptr=ptr("bf16"),
        out_ptr=ptr("bf16"),
        part_ptr=ptr("fp32"),
        count_ptr=ptr("i32"),
        nw_ptr=ptr("bf16"),
        sq_in_ptr=ptr("fp32"),
        res_ptr=ptr("bf16"),
        sq_out_ptr=ptr("fp32"),
        eps="fp32",
    )
    # q/k/v with the norm folded in; down_proj gated, split, with the residual; gate/up at 64
    for rows, n_out, k_len, norm, residual in (
        (16, 4096, 2048, True, False),
        (16, 2048, 6144, False, True),
        (64, 12288, 2048, False, False),
    ):
        launch = linear.default_launch(rows, n_out, k_len, 132)
        for pdl, late in ((False, False), (True, False), (True, True)):
            report(
                f"linear M={rows} N={n_out} split={launch.split} pdl={pdl} late={late}",
                build(
                    linear._skinny_linear_kernel,
                    linear_types,
                    dict(
                        BLOCK_M=max(16, rows),
                        BLOCK_N=launch.block_n,
                        BLOCK_K=launch.block_k,
                        SPLIT=launch.split,
                        HAS_BIAS=False,
                        W_MAJOR=launch.w_major,
                        NUM_STAGES=launch.num_stages,
                        UPCAST=False,
                        PDL=pdl,
                        GATED=residual,
                        NORM=norm,
                        SQ_BLOCKS=32,
                        RESIDUAL=residual,
                        PREFETCH_LINES=32,
                        LATE_TRIGGER=late,
                    ),
                    num_warps=launch.num_warps,
                    num_stages=launch.num_stages,
                ),
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
