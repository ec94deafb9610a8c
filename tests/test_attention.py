"""localbook.attention (and localbook.language) against PyTorch's SDPA, nn.MultiheadAttention, an explicit local mean, and properties."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.nn.functional import scaled_dot_product_attention as sdpa

import localbook as A  # every public name is top-level: lb.local_mean_attention, ...
from localbook._validate import check_finite
from localbook.attention import _attend


@pytest.fixture(autouse=True)
def _float64():
    """Float64 by default in this module (the SDPA comparisons are to 1e-10); restored afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _qkv(
    shape_b=(2, 3),
    Tq=7,
    Tk=7,
    d=5,
    dv=4,
    dtype=torch.float64,
    device="cpu",
    seed=0,
    grad=False,
):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_b, Tq, d, generator=g, dtype=dtype).to(device)
    k = torch.randn(*shape_b, Tk, d, generator=g, dtype=dtype).to(device)
    v = torch.randn(*shape_b, Tk, dv, generator=g, dtype=dtype).to(device)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def _explicit_local_mean(q, k, v, log_kappa=None, scale=None):
    """Σ_s K(t,s) v_s / Σ_s K(t,s) with K = exp(c q·k) κ, written out with einsum and a plain division."""
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    K = torch.exp(torch.einsum("...td,...sd->...ts", q, k) * c)
    if log_kappa is not None:
        K = K * torch.exp(log_kappa)
    return torch.einsum("...ts,...sv->...tv", K, v) / K.sum(-1, keepdim=True)


# --- values and gradients against SDPA -----------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["fused", "explicit", "weights"])
def test_matches_sdpa_values_and_gradients(device, causal, path):
    q, k, v = _qkv(device=device, grad=True)
    kw = dict(fused=(path == "fused"), return_weights=(path == "weights"))
    out = A.local_mean_attention(q, k, v, causal=causal, **kw)
    out = out[0] if path == "weights" else out
    ref = sdpa(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(ref)
    ga = torch.autograd.grad(out, (q, k, v), g)
    gr = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(ga, gr):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fused", [True, False])
def test_matches_sdpa_with_masks_and_scale(device, fused):
    q, k, v = _qkv(Tq=6, Tk=9, device=device, grad=True)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(6, 9, generator=g) > 0.4
    mask[:, 0] = True  # every query keeps at least one key
    mask = mask.to(device)
    bias = torch.randn(2, 3, 6, 9, generator=g, dtype=torch.float64).to(device)
    for temporal in (mask, bias):
        out = A.local_mean_attention(q, k, v, temporal=temporal, scale=0.7, fused=fused)
        ref = sdpa(q, k, v, attn_mask=temporal, scale=0.7)
        torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
        ga = torch.autograd.grad(out.sum(), (q, k, v))
        gr = torch.autograd.grad(ref.sum(), (q, k, v))
        for a, b in zip(ga, gr):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 12),
    d=st.integers(1, 6),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 5)),
    decay=st.one_of(st.none(), st.floats(0, 2)),
    seed=st.integers(0, 2**16),
)
def test_temporal_kernels_equal_explicit_local_mean(T, d, causal, window, decay, seed):
    q, k, v = _qkv(shape_b=(2,), Tq=T, Tk=T, d=d, dv=3, seed=seed)
    tk = A.TemporalKernel(causal=causal, window=window, decay=decay)
    ref = _explicit_local_mean(q, k, v, tk.log_matrix(T, T))
    fused = A.local_mean_attention(q, k, v, temporal=tk)
    explicit, w = A.local_mean_attention(q, k, v, temporal=tk, return_weights=True)
    torch.testing.assert_close(fused, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(explicit, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, T, dtype=w.dtype))


def test_chunked_path_equals_one_chunk():
    q, k, v = _qkv(shape_b=(2,), Tq=50, Tk=50)
    tk = A.TemporalKernel(causal=True, window=7, decay=0.3)
    one = _attend(q, k, v, (2,), temporal=tk, fused=False)
    many = _attend(
        q, k, v, (2,), temporal=tk, fused=False, budget=1
    )  # one query row per chunk
    torch.testing.assert_close(one, many, atol=1e-12, rtol=1e-12)


# --- shapes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_shapes_batched_and_unbatched(batch):
    q, k, v = _qkv(shape_b=batch, Tq=5, Tk=8, d=3, dv=6)
    out, w = A.local_mean_attention(q, k, v, return_weights=True)
    assert out.shape == (*batch, 5, 6)
    assert w.shape == (*batch, 5, 8)
    assert A.local_mean_attention(q, k, v).shape == (*batch, 5, 6)


def test_broadcast_batch_dims_and_dtype_following():
    q, _, _ = _qkv(shape_b=(2, 3), Tq=4, d=3)
    _, k, v = _qkv(shape_b=(1, 3), Tk=6, d=3)
    out = A.local_mean_attention(q, k, v)
    torch.testing.assert_close(out, sdpa(q, k.expand(2, 3, 6, 3), v.expand(2, 3, 6, 4)))
    q32, k32, v32 = _qkv(dtype=torch.float32)
    assert A.local_mean_attention(q32, k32, v32).dtype == torch.float32
    out = A.local_mean_attention([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1.0], [2.0]])
    assert out.dtype == torch.get_default_dtype() and out.shape == (2, 1)


# --- what the temporal kernels do ------------------------------------------------------------------
def test_temporal_kernel_matrices():
    K = A.temporal_kernel(6, causal=True)
    assert torch.equal(K, torch.ones(6, 6).tril())
    K = A.temporal_kernel(6, window=2)
    assert torch.equal(K > 0, (torch.arange(6)[:, None] - torch.arange(6)).abs() < 2)
    K = A.temporal_kernel(5, decay=0.5)
    lag = (torch.arange(5)[:, None] - torch.arange(5)).abs()
    torch.testing.assert_close(K, torch.exp(-0.5 * lag.to(K.dtype)))
    H = A.TemporalKernel(causal=True, decay=A.alibi_slopes(4)).log_matrix(5, 5)
    assert H.shape == (4, 5, 5)
    torch.testing.assert_close(
        A.alibi_slopes(8), 2.0 ** (-torch.arange(1, 9, dtype=torch.get_default_dtype()))
    )


def test_causal_output_ignores_the_future():
    q, k, v = _qkv(shape_b=(), Tq=8, Tk=8)
    out = A.local_mean_attention(q, k, v, causal=True)
    v2 = v.clone()
    v2[5:] += 100.0
    k2 = k.clone()
    k2[5:] -= 3.0
    out2 = A.local_mean_attention(q, k2, v2, causal=True)
    torch.testing.assert_close(out[:5], out2[:5])
    assert not torch.allclose(out[5:], out2[5:])


def test_window_and_decay_effect_on_weights():
    q, k, v = _qkv(shape_b=(), Tq=10, Tk=10)
    _, w = A.local_mean_attention(
        q, k, v, temporal=A.TemporalKernel(causal=True, window=3), return_weights=True
    )
    lag = torch.arange(10)[:, None] - torch.arange(10)
    assert bool((w[(lag < 0) | (lag >= 3)] == 0).all())
    # zero scores: the weights are the normalized temporal kernel itself
    z = torch.zeros(10, 4, dtype=q.dtype)
    _, w0 = A.local_mean_attention(
        z, z, v, temporal=A.TemporalKernel(causal=True, decay=1.0), return_weights=True
    )
    K = A.temporal_kernel(10, causal=True, decay=1.0)
    torch.testing.assert_close(w0, K / K.sum(1, keepdim=True))
    # stronger decay puts more weight on the present token
    _, w5 = A.local_mean_attention(
        z, z, v, temporal=A.TemporalKernel(causal=True, decay=5.0), return_weights=True
    )
    assert bool((w5.diagonal()[1:] > w0.diagonal()[1:]).all())


def test_fully_masked_row_is_nan_with_one_warning():
    q, k, v = _qkv(shape_b=(), Tq=4, Tk=4)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    for fused in (True, False):
        with pytest.warns(UserWarning, match="1 query row"):
            out = A.local_mean_attention(q, k, v, temporal=mask, fused=fused)
        assert bool(torch.isnan(out[2]).all()) and bool(
            torch.isfinite(out[[0, 1, 3]]).all()
        )


# --- other weight maps -----------------------------------------------------------------------------
def test_callable_weights():
    q, k, v = _qkv()
    out = A.local_mean_attention(q, k, v, weights=lambda s: torch.softmax(s, -1))
    torch.testing.assert_close(out, sdpa(q, k, v), atol=1e-12, rtol=1e-12)
    hard = A.local_mean_attention(
        q,
        k,
        v,
        weights=lambda s: torch.nn.functional.one_hot(s.argmax(-1), s.shape[-1]).to(
            s.dtype
        ),
    )
    idx = (q @ k.transpose(-1, -2)).argmax(-1)
    torch.testing.assert_close(
        hard, torch.gather(v, -2, idx[..., None].expand(*idx.shape, v.shape[-1]))
    )
    with pytest.raises(ValueError, match="weights callable"):
        A.local_mean_attention(q, k, v, weights=lambda s: s[..., :1])


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_weights_match_entmax_package(name, causal):
    pytest.importorskip("localbook.entmax")
    entmax = pytest.importorskip("entmax")
    q, k, v = _qkv()
    out, w = A.local_mean_attention(
        q, k, v, causal=causal, weights=name, return_weights=True
    )
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -1e9)
    ref = getattr(entmax, name)(s, dim=-1)
    torch.testing.assert_close(w, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, ref @ v, atol=1e-10, rtol=1e-10)
    assert bool((w == 0).any())  # sparse: some keys get exactly zero weight


# --- layers ----------------------------------------------------------------------------------------
def test_multihead_layer_equals_nn_multiheadattention():
    torch.manual_seed(0)
    d, H = 12, 3
    ours = A.LocalMeanAttention(d, H, causal=True)
    ref = torch.nn.MultiheadAttention(d, H, batch_first=True)
    with torch.no_grad():
        ours.qkv.weight.copy_(ref.in_proj_weight)
        ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.out.weight.copy_(ref.out_proj.weight)
        ours.out.bias.copy_(ref.out_proj.bias)
    x = torch.randn(2, 9, d)
    mask = torch.ones(9, 9, dtype=torch.bool).triu(
        1
    )  # True = masked, in nn.MultiheadAttention
    y_ref, w_ref = ref(x, x, x, attn_mask=mask, average_attn_weights=False)
    y, w = ours(x, return_weights=True)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(w, w_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(
        ours(x[0]), y_ref[0], atol=1e-10, rtol=1e-10
    )  # unbatched


def test_transformer_shapes_causality_and_training(device):
    torch.manual_seed(0)
    m = A.LocalTransformer(
        11,
        d_model=16,
        n_heads=2,
        n_layers=2,
        context=12,
        temporal=A.TemporalKernel(decay=A.alibi_slopes(2)),
    ).to(device)
    idx = torch.randint(0, 11, (3, 12), device=device)
    logits = m(idx)
    assert logits.shape == (3, 12, 11)
    ws = m.attention_weights(idx)
    assert len(ws) == 2 and ws[0].shape == (3, 2, 12, 12)
    assert bool((ws[0].triu(1) == 0).all())
    idx2 = idx.clone()
    idx2[:, 8:] = (idx2[:, 8:] + 1) % 11
    torch.testing.assert_close(
        m(idx2)[:, :8], logits[:, :8]
    )  # no peeking at the future
    tokens = (
        torch.arange(300, device=device) % 11
    )  # a periodic sequence is easy to learn
    h1 = A.train_language_model(
        m, tokens, n_steps=30, batch_size=8, context=12, lr=1e-2, seed=1, progress=False
    )
    assert h1.train_loss[-1] < 0.5 * h1.train_loss[0]
    assert A.evaluate_loss(m, tokens, context=12) < math.log(11)
    out = m.generate(tokens[:5], 7, seed=3)
    assert out.shape == (12,) and torch.equal(out[:5], tokens[:5])
    assert torch.equal(out, m.generate(tokens[:5], 7, seed=3))


def test_training_is_seeded():
    tokens = torch.randint(0, 7, (400,), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(2):
        torch.manual_seed(5)
        m = A.LocalTransformer(7, d_model=8, n_heads=2, n_layers=1, context=8)
        losses.append(
            A.train_language_model(
                m, tokens, n_steps=5, batch_size=4, context=8, seed=2, progress=False
            ).train_loss
        )
    assert losses[0] == losses[1]


# --- tokenizer, discrete kernels, graphs ---------------------------------------------------------------
def test_tokenizer_round_trip_on_oliver_twist():
    import localbook as lb

    text = lb.datasets.load_oliver_twist()
    tok = A.CharTokenizer(text)
    passage = text[10_000:12_000]
    ids = tok.encode(passage)
    assert ids.dtype == torch.long and ids.shape == (2000,)
    assert tok.decode(ids) == passage
    assert len(tok) == len(set(text))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("Oliver ☃")
    with pytest.raises(ValueError, match="ids must be in"):
        tok.decode([0, len(tok)])


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_tokenizer_round_trip_property(text):
    tok = A.CharTokenizer(text)
    assert tok.decode(tok.encode(text)) == text


def test_bigram_kernel_is_the_mle_of_the_discrete_kernel():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5, (500,), generator=g)
    C = A.bigram_counts(tokens, 5)
    assert float(C.sum()) == 499
    P = A.bigram_kernel(tokens, 5, smoothing=0.0)
    torch.testing.assert_close(P.sum(1), torch.ones(5))
    # the cross-entropy gradient vanishes at L = log P (count ratios are the maximum-likelihood kernel)
    m = A.DiscreteKernel(5)
    with torch.no_grad():
        m.log_kernel.copy_(torch.log(P))
    loss = torch.nn.functional.cross_entropy(
        m(tokens[:-1]), tokens[1:], reduction="sum"
    )
    (grad,) = torch.autograd.grad(loss, m.log_kernel)
    assert float(grad.abs().max()) < 1e-9
    torch.testing.assert_close(m.kernel(), P)


def test_low_rank_discrete_kernel():
    m = A.DiscreteKernel(9, rank=2)
    L = m.log_matrix()
    assert L.shape == (9, 9)
    assert torch.linalg.matrix_rank(L - m.bias).item() <= 2
    idx = torch.tensor([[1, 2, 3]])
    assert m(idx).shape == (1, 3, 9)


def test_attention_graph_and_word_groups():
    text = "Please, sir, I want some more."
    groups, words = A.word_groups(text)
    assert words == ["Please", ",", "sir", ",", "I", "want", "some", "more", "."]
    assert groups.shape == (len(text),)
    T = len(text)
    w = torch.softmax(
        torch.randn(T, T).masked_fill(
            ~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf
        ),
        -1,
    )
    G = A.attention_graph(w, words, groups=groups, threshold=0.05)
    torch.testing.assert_close(G.weights.sum(1), torch.ones(len(words)))
    assert bool((G.edge_weights >= 0.05).all())
    assert bool(
        (G.edges[:, 0] >= G.edges[:, 1]).all()
    )  # causal: edges point to the past
    assert bool((G.edges[:, 0] != G.edges[:, 1]).all())
    pytest.importorskip("networkx")
    assert G.to_networkx().number_of_edges() == G.edges.shape[0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    A.draw_attention_graph(G, ax)
    plt.close(fig)


# --- bad inputs --------------------------------------------------------------------------------------
def test_bad_inputs_are_rejected_clearly():
    q, k, v = _qkv()
    with pytest.raises(
        ValueError, match="q and k must have the same feature dimension"
    ):
        A.local_mean_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="k and v must have the same length"):
        A.local_mean_attention(q, k, v[..., :5, :])
    with pytest.raises(ValueError, match="q must have shape"):
        A.local_mean_attention(q[0, 0, 0], k, v)
    with pytest.raises(ValueError, match="do not broadcast"):
        A.local_mean_attention(q, k[:1, :2], v)
    with pytest.raises(ValueError, match="unknown weights"):
        A.local_mean_attention(q, k, v, weights="hardmax")
    with pytest.raises(ValueError, match="scale"):
        A.local_mean_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="k contains"):
        A.local_mean_attention(q, k.masked_fill(k > 1, math.nan), v)
    with pytest.raises(TypeError, match="q must be"):
        A.local_mean_attention("q", k, v)
    with pytest.raises(TypeError, match="causal"):
        A.local_mean_attention(q, k, v, causal="yes")
    with pytest.raises(TypeError, match="temporal"):
        A.local_mean_attention(q, k, v, temporal="causal")
    with pytest.raises(ValueError, match="temporal tensor"):
        A.local_mean_attention(q, k, v, temporal=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="window"):
        A.TemporalKernel(window=0)
    with pytest.raises(ValueError, match="decay"):
        A.TemporalKernel(decay=-1.0)
    with pytest.raises(ValueError, match="divisible"):
        A.LocalMeanAttention(10, 3)
    with pytest.raises(ValueError, match="context"):
        A.LocalTransformer(5, d_model=8, n_heads=2, context=4)(
            torch.zeros(1, 6, dtype=torch.long)
        )
    with pytest.raises(ValueError, match="idx must hold token ids"):
        A.LocalTransformer(5, d_model=8, n_heads=2, context=4)(torch.full((1, 3), 7))
    with pytest.raises(TypeError, match="text must be a str"):
        A.CharTokenizer(123)
    with pytest.raises(ValueError, match="labels must name"):
        A.attention_graph(torch.eye(3), ["a", "b"])


def test_finite_check_is_exact_when_the_sum_overflows():
    big = torch.full((2, 3), 1e308)
    check_finite(big, "q")  # every entry finite: accepted although the sum is inf
    with pytest.raises(ValueError, match="v contains 1 NaN"):
        check_finite(torch.tensor([[1.0, math.nan]]), "v")


@pytest.mark.parametrize("causal", [False, True])
def test_window_past_the_keys_gives_empty_rows(causal):
    q, k, v = _qkv(shape_b=(), Tq=9, Tk=3)
    tk = A.TemporalKernel(causal=causal, window=2)
    expected = torch.isneginf(tk.log_matrix(9, 3)).all(-1)
    assert bool(expected.any())
    for fused in (True, False):
        with pytest.warns(UserWarning, match=f"{int(expected.sum())} query row"):
            out = A.local_mean_attention(q, k, v, temporal=tk, fused=fused)
        assert torch.equal(torch.isnan(out).all(-1), expected)
        ref = _explicit_local_mean(q, k, v, tk.log_matrix(9, 3))
        torch.testing.assert_close(
            out[~expected], ref[~expected], atol=1e-10, rtol=1e-10
        )


def test_temporal_as_dict_and_sparse_layer_gradients():
    q, k, v = _qkv()
    torch.testing.assert_close(
        A.local_mean_attention(
            q, k, v, temporal={"window": 3, "decay": 0.2}, causal=True
        ),
        A.local_mean_attention(q, k, v, temporal=A.TemporalKernel(True, 3, 0.2)),
    )
    pytest.importorskip("localbook.entmax")
    torch.manual_seed(0)
    m = A.LocalTransformer(
        11, d_model=16, n_heads=2, n_layers=1, context=12, weights="sparsemax"
    )
    idx = torch.randint(0, 11, (2, 12))
    m(idx).sum().backward()
    assert m.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert bool((m.attention_weights(idx)[0] == 0).any())


@given(
    V=st.integers(2, 8),
    r=st.integers(1, 4),
    n=st.integers(2, 60),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=40, deadline=None)
def test_attention_over_a_token_memory_is_the_grouped_kernel_bigram(V, r, n, seed):
    """One-hot queries and keys through W_q, W_k, values the one-hot next tokens of a memory:
    the attention output is (K C)/(K n) with K(a, a') = exp(<W_q e_a, W_k e_a'>/sqrt r) and C the
    bigram counts of the memory (the chapter's query-key kernel between current tokens)."""
    g = torch.Generator().manual_seed(seed)
    mem = torch.randint(0, V, (n,), generator=g)
    Wq, Wk = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g)
    out = A.local_mean_attention(
        Wq,
        Wk[mem[:-1]],
        torch.nn.functional.one_hot(mem[1:], V).double(),
        scale=1 / math.sqrt(r),
    )
    K = torch.exp(Wq @ Wk.T / math.sqrt(r))
    C = A.bigram_counts(mem, V)
    grouped = (K @ C) / (K @ C.sum(1))[:, None]
    torch.testing.assert_close(out, grouped, rtol=1e-12, atol=1e-12)


# --- dtypes: no silent casts (as torch's SDPA) ---------------------------------------------------------
@pytest.mark.parametrize("which", ["k", "v"])
def test_mismatched_dtypes_raise_like_sdpa(which):
    q, k, v = _qkv()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].float()
    with pytest.raises(RuntimeError, match="same dtype"):  # what PyTorch does
        sdpa(args["q"], args["k"], args["v"])
    for kw in ({}, {"fused": False}, {"weights": "sparsemax"}):
        with pytest.raises(
            TypeError,
            match=f"{which} has dtype torch.float32 but q has dtype torch.float64",
        ):
            A.local_mean_attention(args["q"], args["k"], args["v"], **kw)
    with pytest.raises(
        TypeError, match="k has dtype torch.float64 but q has dtype torch.float32"
    ):
        A.local_mean_attention(q.float(), k, v.float())
    # array-likes and integer tensors carry no float precision: they still follow q
    out = A.local_mean_attention(
        q[0, 0], k[0, 0].tolist(), torch.ones(7, 2, dtype=torch.long)
    )
    assert out.dtype == q.dtype


# --- α-entmax attention with a learnable α per head ------------------------------------------------------
def _masked_scores(q, k):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return s.masked_fill(
        ~torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(), -math.inf
    )


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.5, 1.9, 2.0])
def test_entmax_alpha_attention_is_entmax_bisect_of_the_scores(alpha):
    q, k, v = _qkv(shape_b=(2, 3), seed=1)
    ref = A.entmax_bisect(_masked_scores(q, k), alpha, n_iter=100)  # the float-α solver
    per_head = torch.tensor(
        [alpha, 1.5, 2.0]
    )  # tensor α, one per head: the Newton forward
    ref_h = torch.stack(
        [
            A.entmax_bisect(_masked_scores(q, k)[:, h], float(a), n_iter=100)
            for h, a in enumerate(per_head)
        ],
        1,
    )
    for a, r in ((alpha, ref), (torch.tensor(alpha), ref), (per_head, ref_h)):
        for fused in (True, False):
            out, w = A.local_mean_attention(
                q,
                k,
                v,
                causal=True,
                weights="entmax_bisect",
                alpha=a,
                return_weights=True,
                fused=fused,
            )
            # both solve Σ p = 1 for τ to a few ulps; p = x^r magnifies that by ≤ r = 1/(α − 1)
            tol = 64 * torch.finfo(q.dtype).eps / (min(alpha, 1.5) - 1)
            torch.testing.assert_close(w, r, rtol=0, atol=tol)
            torch.testing.assert_close(
                out, r @ v, rtol=0, atol=tol * float(v.abs().max()) * 7
            )
    assert bool((w == 0).any())


def test_entmax_alpha_two_is_sparsemax_attention():
    q, k, v = _qkv(seed=2)
    sp_out, sp_w = A.local_mean_attention(
        q, k, v, causal=True, weights="sparsemax", return_weights=True
    )
    out, w = A.local_mean_attention(
        q,
        k,
        v,
        causal=True,
        weights="entmax_bisect",
        alpha=torch.full((3,), 2.0),
        return_weights=True,
    )
    torch.testing.assert_close(w, sp_w, rtol=0, atol=1e-14)
    torch.testing.assert_close(out, sp_out, rtol=0, atol=1e-13)
    # α → 2: the weights approach sparsemax's, at first order in 2 − α
    gaps = [
        float(
            (
                A.local_mean_attention(
                    q,
                    k,
                    v,
                    causal=True,
                    weights="entmax_bisect",
                    alpha=torch.full((3,), 2 - d),
                    return_weights=True,
                )[1]
                - sp_w
            )
            .abs()
            .max()
        )
        for d in (1e-2, 1e-3, 1e-4)
    ]
    assert gaps[0] > 0 and all(5 * b <= a for a, b in zip(gaps, gaps[1:]))
    # the layer: a per-head α at its upper end (2) is the sparsemax layer
    torch.manual_seed(0)
    sparse = A.LocalMeanAttention(12, 3, weights="sparsemax")
    adaptive = A.LocalMeanAttention(12, 3, weights="entmax_bisect")
    adaptive.load_state_dict(sparse.state_dict(), strict=False)
    with torch.no_grad():
        adaptive.alpha_logit.fill_(40.0)  # sigmoid(40) = 1 in float64
    assert bool((adaptive.alpha == 2).all())
    x = torch.randn(2, 9, 12)
    torch.testing.assert_close(adaptive(x), sparse(x), rtol=0, atol=1e-13)


def test_alpha_gradient_by_finite_differences():
    q, k, v = _qkv(shape_b=(1, 2), Tq=5, Tk=5, d=3, dv=2, seed=3)
    q.requires_grad_(True)
    alpha = torch.tensor([1.3, 1.8], requires_grad=True)

    def f(q_, a_):
        return A.local_mean_attention(
            q_, k, v, causal=True, weights="entmax_bisect", alpha=a_
        )

    assert torch.autograd.gradcheck(f, (q, alpha), eps=1e-6, atol=1e-7)
    # the layer's parameter: d(loss)/d alpha_logit by central differences
    torch.manual_seed(1)
    layer = A.LocalMeanAttention(6, 2, weights="entmax_bisect")
    x = torch.randn(2, 7, 6)
    layer(x).square().sum().backward()
    g = layer.alpha_logit.grad.clone()
    assert bool((g != 0).all())
    for h in range(2):
        vals = []
        for e in (1e-6, -1e-6):
            with torch.no_grad():
                layer.alpha_logit[h] += e
                vals.append(float(layer(x).square().sum()))
                layer.alpha_logit[h] -= e
        torch.testing.assert_close(
            torch.tensor((vals[0] - vals[1]) / 2e-6), g[h], rtol=1e-5, atol=1e-8
        )


def test_learned_alpha_stays_in_one_to_two_and_trains():
    torch.manual_seed(0)
    m = A.LocalTransformer(
        11, d_model=16, n_heads=2, n_layers=2, context=12, weights="entmax_bisect"
    ).float()
    assert m.alphas().shape == (2, 2) and bool((m.alphas() == 1.5).all())
    tokens = torch.arange(300) % 11
    seen = []
    h = A.train_language_model(
        m,
        tokens,
        n_steps=40,
        batch_size=8,
        context=12,
        lr=1e-2,
        seed=1,
        progress=False,
        log_every=5,
        callback=lambda s, mod: seen.append(mod.alphas()),
    )
    assert h.train_loss[-1] < 0.5 * h.train_loss[0]
    traj = torch.stack(seen)
    assert traj.shape == (len(h.steps), 2, 2) and bool((traj != 1.5).any())  # α moved
    assert bool(((traj > 1) & (traj < 2)).all())
    # pushed hard towards softmax, α stays above 1 (the sigmoid never reaches 0)
    layer = A.LocalMeanAttention(4, 2, weights="entmax_bisect").float()
    opt = torch.optim.SGD([layer.alpha_logit], lr=5.0)
    for _ in range(3):
        opt.zero_grad()
        layer.alpha.sum().backward()
        opt.step()
    assert bool((layer.alpha > 1).all())
    assert layer(torch.randn(3, 4, dtype=torch.float32)).shape == (3, 4)
    per_tok = A.evaluate_loss(m, tokens, context=12, reduction="none")
    assert (
        per_tok.shape == (24, 12)
        and abs(float(per_tok.mean()) - A.evaluate_loss(m, tokens, context=12)) < 1e-12
    )
    assert A.LocalTransformer(11, d_model=8, n_heads=2, context=4).alphas() is None


def test_entmax_alpha_attention_bad_inputs():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="needs alpha"):
        A.local_mean_attention(q, k, v, weights="entmax_bisect")
    with pytest.raises(ValueError, match="alpha is used only with"):
        A.local_mean_attention(q, k, v, alpha=1.5)
    for bad in (1.0, 0.5, torch.tensor([1.5, 1.0, 1.2]), torch.tensor(math.nan)):
        with pytest.raises(ValueError, match="alpha must be"):
            A.local_mean_attention(q, k, v, weights="entmax_bisect", alpha=bad)
    with pytest.raises(ValueError, match="must broadcast to the batch shape"):
        A.local_mean_attention(
            q, k, v, weights="entmax_bisect", alpha=torch.full((4,), 1.5)
        )
    with pytest.raises(TypeError, match="floating tensor"):
        A.local_mean_attention(
            q, k, v, weights="entmax_bisect", alpha=torch.tensor([2, 2, 2])
        )
    with pytest.raises(TypeError, match="alpha"):
        A.local_mean_attention(q, k, v, weights="entmax_bisect", alpha="1.5")
    with pytest.raises(ValueError, match=r"in \(1, 2\)"):
        A.LocalMeanAttention(8, 2, weights="entmax_bisect", alpha=2.5)
    from localbook.entmax_alpha import entmax_alpha_newton

    with pytest.raises(ValueError, match=r"in \(1, 2\]"):
        entmax_alpha_newton(torch.zeros(3, 4), torch.tensor([[3.0]]))
    # α > 2 as a tensor: the bisection solver, still entmax_bisect of the scores
    _, w = A.local_mean_attention(
        q,
        k,
        v,
        causal=True,
        weights="entmax_bisect",
        alpha=torch.tensor([2.5, 3.0, 1.5]),
        return_weights=True,
    )
    ref = A.entmax_bisect(
        _masked_scores(q, k), torch.tensor([2.5, 3.0, 1.5])[:, None, None]
    )
    torch.testing.assert_close(w, ref, rtol=0, atol=1e-12)


def test_check_values_is_one_switch_for_the_nan_check():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=g) for _ in range(3))
    bad = k.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="k"):
        A.local_mean_attention(q, bad, v)
    # skipped on request: NaN propagates as in SDPA (batch 1 only), no error
    out = A.local_mean_attention(q, bad, v, check_values=False)
    ref = torch.nn.functional.scaled_dot_product_attention(q, bad, v)
    torch.testing.assert_close(out, ref, equal_nan=True)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    with pytest.raises(TypeError, match="check_values"):
        A.local_mean_attention(q, k, v, check_values=1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_softmax_path_has_no_host_sync_when_values_are_not_checked():
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda") for _ in range(3))
    A.local_mean_attention(q, k, v, causal=True, check_values=False)  # warm-up
    torch.cuda.set_sync_debug_mode("error")
    try:
        for causal in (False, True):
            A.local_mean_attention(q, k, v, causal=causal, check_values=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
