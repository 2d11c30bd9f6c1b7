# A GEMV projection followed by the seed's softmax sequence (seed §3.1: exp, reduce_sum, scale),
# written in the `emu pccx disasm` text form plus driver directives (actors/pccx/asmprog.py).
# parallel_lane=2: the as-built machine (pccx-v002-rtl) wires weights to lanes A/B only; lanes C/D
# would compute their rows on zero weights.
data x len=512                      # activation, BF16
weights wq n=64 k=512 scale=1       # INT4 [64, 512] + per-channel BF16 scales
out scores bytes=128                # 64 BF16
out probs bytes=128
MEMSET dest_cache=0 dest_addr=0 a_value=512 b_value=1 c_value=1     # fmap[0]: K = 512
MEMSET dest_cache=1 dest_addr=1 a_value=64 b_value=512 c_value=1    # weight[1]: N = 64, K = 512
MEMSET dest_cache=0 dest_addr=2 a_value=64 b_value=1 c_value=1      # fmap[2]: 64 elements out
MEMCPY from_device=1 to_device=0 dest_addr=0 src_addr=0 aux_addr=@x shape_ptr_addr=0 async=0
stream gemv wq parallel_lane=2      # rows 0-31 -> lane A (HP2), 32-63 -> lane B (HP3)
GEMV dest_reg=64 src_addr=0 findemax=1 accm=0 w_scale=1 size_ptr_addr=1 shape_ptr_addr=0 parallel_lane=2
wait projection
# scores at L2 word 64 = element 512; EXP output at element 1025, the sum lands at element 1024
CVO cvo_func=EXP src_addr=512 dst_addr=1025 length=64 sub_emax=1 recip_scale=0 accm=0 async=1
CVO cvo_func=REDUCE_SUM src_addr=1025 dst_addr=1024 length=64 sub_emax=0 recip_scale=0 accm=0 async=1
CVO cvo_func=SCALE src_addr=1024 dst_addr=1152 length=65 sub_emax=0 recip_scale=1 accm=0 async=0
wait softmax
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=64 aux_addr=@scores shape_ptr_addr=2 async=1
MEMCPY from_device=0 to_device=1 dest_addr=0 src_addr=144 aux_addr=@probs shape_ptr_addr=2 async=0
wait results
