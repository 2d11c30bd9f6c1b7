"""Write allreduce_4rank/chakra.<r>.et: a hand-written 4-rank Chakra graph with a collective (this project's own).

Each rank loads a 32x64 fp16 block from its HBM, multiplies it by a 64x32 block (GEMM), takes the exp of
the 32x32 result (MATH), all-reduces 4 KiB over the four ranks (one COMM_COLL_NODE), passes 1 KiB to the
next rank round a ring (COMM_SEND_NODE / COMM_RECV_NODE, tag 0), adds what it received and stores the
result.  Regenerate from the repository root: PYTHONPATH=. python scenarios/ahbm/chakra/make_allreduce_4rank.py
"""
from __future__ import annotations

import os

from protocols.chakra.io import attr, pb, write_et

RANKS = 4
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_4rank")


def node(i, name, typ, deps=(), **attrs):
    n = pb.Node(id=i, name=name, type=typ, data_deps=list(deps))
    n.attr.extend(attr(k, v, kind) for k, (v, kind) in attrs.items())
    return n


def rank_nodes(r: int) -> list:
    nxt, prv = (r + 1) % RANKS, (r - 1) % RANKS
    i64, u64, i32, s = "int64_val", "uint64_val", "int32_val", "string_val"
    return [
        node(0, "load x", pb.MEM_LOAD_NODE, tensor_size=(32 * 64 * 2, u64)),
        node(1, "gemm 32x64x32", pb.COMP_NODE, [0], m=(32, i64), k=(64, i64), n=(32, i64),
             num_ops=(2 * 32 * 64 * 32, i64), tensor_size=((32 * 64 + 64 * 32) * 2 + 32 * 32 * 4, u64)),
        node(2, "exp", pb.COMP_NODE, [1], op=("exp", s), elements=(1024, i64), num_ops=(1024, i64),
             tensor_size=(8192, u64)),
        node(3, "all-reduce 4 KiB", pb.COMM_COLL_NODE, [2], comm_type=(pb.ALL_REDUCE, i64), comm_size=(4096, i64)),
        node(4, f"send to {nxt}", pb.COMM_SEND_NODE, [3], comm_src=(r, i32), comm_dst=(nxt, i32), comm_tag=(0, i32),
             comm_size=(1024, i64)),
        node(5, f"recv from {prv}", pb.COMM_RECV_NODE, [3], comm_src=(prv, i32), comm_dst=(r, i32),
             comm_tag=(0, i32), comm_size=(1024, i64)),
        node(6, "add", pb.COMP_NODE, [5], op=("add", s), elements=(256, i64), srcs=(2, i64), num_ops=(256, i64),
             tensor_size=(3072, u64)),
        node(7, "store", pb.MEM_STORE_NODE, [6, 4], tensor_size=(1024, u64)),
    ]


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    for r in range(RANKS):
        meta = pb.GlobalMetadata(version="1.0.0")
        meta.attr.extend([attr("source", "accel-emulator example (hand-written)"), attr("rank", r),
                          attr("ranks", RANKS)])
        write_et(os.path.join(HERE, f"chakra.{r}.et"), meta, rank_nodes(r))


if __name__ == "__main__":
    main()
