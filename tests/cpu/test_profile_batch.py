"""loadtest/profile_batch.py without a GPU: kernels sorted into what they compute, and a full
batch of a shape packed within the budget."""

from loadtest.profile_batch import category, full_batch, parse_shapes


def test_kernels_are_sorted_by_what_they_compute():
    assert category("BatchPrefillWithRaggedKVCacheKernel<...>") == "attention"
    assert category("void flashinfer::MergeStates<...>") == "attention"
    assert category("_add_rms_norm_kernel") == "norm and rope"
    assert category("_qk_norm_rope_kernel") == "norm and rope"
    assert category("_log_sum_exp_kernel") == "label log-probs"
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "linears"
    assert category("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN") == "linears"
    assert category("_gate_up_silu_kernel") == "linears"
    assert category("Memcpy HtoD (Pinned -> Device)") == "copies"
    assert category("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"


def test_a_full_batch_holds_as_many_requests_as_the_budget_takes():
    sequences, labels, requests = full_batch((300, 100, 10), 8192, 16384, 32768, vocab=20000)
    tokens = sum(s.num_tokens for s in sequences)
    per_request = tokens / requests
    assert tokens <= 8192 < tokens + per_request  # one more request would not fit
    assert sum(s.num_items for s in sequences) == 100 * requests
    assert len(labels) == len(sequences)
    # a request larger than the budget still makes a batch of one
    _, _, alone = full_batch((300, 100, 10), 100, 16384, 32768, vocab=20000)
    assert alone == 1
    assert parse_shapes("120x10x180,300x100x10") == [(120, 10, 180), (300, 100, 10)]
