"""JAX training (XLA with its autotuner on): jit + value_and_grad + a hand-written Adam update,
an MLP trained in float32 and in bf16 (float32 master weights), and a matmul chain in float32
and bf16 on integer-valued data.

Run without --xla_gpu_deterministic_ops, so XLA autotunes its GEMM fusions (cuBLAS against
Triton tilings, timing each candidate) and may pick different kernels on different runs. The
output is the same whichever it picks: the matmul chain's values are small integers (every
product and partial sum is exact in float32, whatever the order), and the losses are rounded
(float32 to 4 decimals at HIGHEST precision, bf16 to 2)."""
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import functools
import hashlib

import numpy as np
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST
tree_map = jax.tree_util.tree_map
rng = np.random.default_rng(0)


# --- matmul chain on exact integers: autotuned GEMM fusions, bit-identical results ---------
def chain(x, ws, dtype):
    y = None
    for w in ws:
        y = jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
        x = jnp.clip(y, -2.0, 2.0)          # back to {-2..2}: exact in bf16 too
    return y, jnp.maximum(y, 0.0).sum(axis=0)


chain_jit = jax.jit(chain, static_argnums=2)
xi = jnp.asarray(rng.integers(-2, 3, (512, 1024)).astype(np.float32))
wsi = [jnp.asarray(rng.integers(-2, 3, shape).astype(np.float32))
       for shape in ((1024, 1024), (1024, 768), (768, 512))]
for dt in (jnp.float32, jnp.bfloat16):
    y, colsum = chain_jit(xi, wsi, dt)
    y = np.asarray(y).astype(np.int64)
    c = np.asarray(colsum).astype(np.int64)
    print("chain", jnp.dtype(dt).name, "sum", int(y.sum()), "abs", int(np.abs(y).sum()), "colsum", int(c.sum()),
          "sha256", hashlib.sha256(y.astype(np.int32).tobytes()).hexdigest()[:32])


# --- MLP training with a hand-written Adam -------------------------------------------------
def init_params(sizes):
    params = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((m, n), dtype=np.float32) / np.float32(np.sqrt(m))
        params.append((jnp.asarray(w), jnp.zeros((n,), jnp.float32)))
    return params


def mlp(params, x, dtype, precision):
    x = x.astype(dtype)
    for i, (w, b) in enumerate(params):
        x = jnp.matmul(x, w.astype(dtype), precision=precision) + b.astype(dtype)
        if i < len(params) - 1:
            x = jax.nn.gelu(x)
    return x.astype(jnp.float32)


def loss_fn(params, x, onehot, dtype, precision):
    logp = jax.nn.log_softmax(mlp(params, x, dtype, precision))
    return -(onehot * logp).sum(axis=-1).mean()


def adam(params, grads, m, v, t, lr=2e-3, b1=0.9, b2=0.999, eps=1e-8):
    m = tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
    v = tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
    c1 = 1.0 / (1.0 - b1 ** t)
    c2 = 1.0 / (1.0 - b2 ** t)
    params = tree_map(lambda p, m_, v_: p - lr * (m_ * c1) / (jnp.sqrt(v_ * c2) + eps), params, m, v)
    return params, m, v


def make_step(dtype, precision):
    def step(params, m, v, t, x, onehot):
        f = functools.partial(loss_fn, dtype=dtype, precision=precision)
        loss, grads = jax.value_and_grad(f)(params, x, onehot)
        params, m, v = adam(params, grads, m, v, t)
        return params, m, v, loss
    return jax.jit(step)


sizes = (256, 1024, 512, 16)
data = [(jnp.asarray(rng.standard_normal((512, 256), dtype=np.float32)),
         jax.nn.one_hot(jnp.asarray(rng.integers(0, 16, 512)), 16)) for _ in range(3)]
for name, dtype, precision, digits in (("float32", jnp.float32, HIGHEST, 4), ("bf16", jnp.bfloat16, None, 2)):
    params = init_params(sizes)
    m = tree_map(jnp.zeros_like, params)
    v = tree_map(jnp.zeros_like, params)
    step = make_step(dtype, precision)
    losses = []
    for t in range(1, 7):
        x, onehot = data[(t - 1) % len(data)]
        params, m, v, loss = step(params, m, v, jnp.float32(t), x, onehot)
        losses.append(round(float(loss), digits))
    print("train", name, "losses", losses, "decreased", losses[-1] < losses[0])
