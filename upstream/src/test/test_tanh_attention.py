# Owner(s): ["module: autograd"]
"""Autograd Onboarding Lab, part II: tanh attention as a custom autograd.Function.

    x = q @ k.T ; a = tanh(x) ; o = a @ v ; return o, a        q: (n, d), k: (n, d), v: (n, e)

Backward (PyTorch's conjugate convention; for real dtypes every conj is a no-op):
    Ĝ_A = G_O Vᴴ + G_A   G_X = Ĝ_A ⊙ conj(1 − A²)   G_Q = G_X K̄   G_K = G_Xᵀ Q̄   G_V = Aᴴ G_O
Forward mode:
    Ẋ = Q̇ Kᵀ + Q K̇ᵀ      Ȧ = (1 − A²) ⊙ Ẋ           Ȯ = Ȧ V + A V̇
"""

import torch
from torch.autograd import Function
from torch.autograd.gradcheck import gradcheck, gradgradcheck
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests, TestCase


class TanhAttention(Function):
    @staticmethod
    def forward(q, k, v):
        a = torch.tanh(q @ k.mT)
        return a @ v, a

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        need_q, need_k, need_v = ctx.needs_input_grad
        # Save the output a (never x, never recompute tanh) and only the inputs a needed gradient reads.
        ctx.save_for_backward(q if need_k else None, k if need_q else None,
                              v if (need_q or need_k) else None, output[1])
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros are built
        ctx.save_for_forward(q, k, v, output[1])  # what jvp reads (forward AD runs it right away)

    @staticmethod
    def backward(ctx, grad_o, grad_a):
        q, k, v, a = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad
        grad_q = grad_k = grad_v = None
        if need_v and grad_o is not None:
            grad_v = a.mH @ grad_o
        if need_q or need_k:
            if grad_o is not None:
                grad_a = grad_o @ v.mH if grad_a is None else torch.addmm(grad_a, grad_o, v.mH)
            if grad_a is not None:
                grad_x = torch.ops.aten.tanh_backward(grad_a, a)
                grad_q = grad_x @ k.conj() if need_q else None
                grad_k = grad_x.mT @ q.conj() if need_k else None
        return grad_q, grad_k, grad_v

    @staticmethod
    def jvp(ctx, q_t, k_t, v_t):
        q, k, v, a = ctx.saved_tensors
        x_t = None
        if q_t is not None:
            x_t = q_t @ k.mT
        if k_t is not None:
            x_t = q @ k_t.mT if x_t is None else torch.addmm(x_t, q, k_t.mT)
        a_t = torch.zeros_like(a) if x_t is None else torch.ops.aten.tanh_backward(x_t, a.conj())
        o_t = a_t @ v
        if v_t is not None:
            o_t = torch.addmm(o_t, a, v_t)
        return o_t, a_t


def tanh_attention(q, k, v):
    return TanhAttention.apply(q, k, v)


def reference(q, k, v):
    a = torch.tanh(q @ k.mT)
    return a @ v, a


SHAPES = ((2, 3, 4), (1, 1, 1), (4, 2, 5), (3, 5, 2), (0, 3, 4), (3, 0, 4), (3, 3, 0))


class TestTanhAttention(TestCase):
    def _inputs(self, n, d, e, device, dtype, requires_grad=(True, True, True)):
        return tuple(torch.empty(shape, device=device, dtype=dtype).uniform_(-1, 1).requires_grad_(rg)
                     for shape, rg in zip(((n, d), (n, d), (n, e)), requires_grad))

    @dtypes(torch.float64, torch.complex128)
    @parametrize("shape", SHAPES)
    def test_gradcheck(self, device, dtype, shape):
        inputs = self._inputs(*shape, device, dtype)
        self.assertTrue(gradcheck(tanh_attention, inputs, check_forward_ad=True, check_batched_grad=True))
        self.assertTrue(gradgradcheck(tanh_attention, inputs, check_fwd_over_rev=True))

    @dtypes(torch.float64, torch.complex128)
    def test_matches_autograd_of_reference(self, device, dtype):
        inputs = self._inputs(3, 2, 4, device, dtype)
        for output_weights in ((1, 1), (1, 0), (0, 1)):   # loss of both outputs, of o only, of a only
            def loss(fn):
                o, a = fn(*inputs)
                return output_weights[0] * o.abs().sum() + output_weights[1] * a.abs().sum()
            self.assertEqual(torch.autograd.grad(loss(tanh_attention), inputs),
                             torch.autograd.grad(loss(reference), inputs))

    def test_unused_output_gets_no_zeros(self, device):
        q, k, v = self._inputs(3, 2, 4, device, torch.float64)
        seen = []

        class Spy(TanhAttention):
            @staticmethod
            def backward(ctx, grad_o, grad_a):
                seen.append((grad_o is None, grad_a is None))
                return TanhAttention.backward(ctx, grad_o, grad_a)

        Spy.apply(q, k, v)[0].sum().backward()
        Spy.apply(q, k, v)[1].sum().backward()
        self.assertEqual(seen, [(False, True), (True, False)])

    @parametrize("requires_grad", ((True, False, False), (False, True, False), (False, False, True),
                                   (True, True, False)))
    def test_saves_output_and_only_needed_inputs(self, device, requires_grad):
        q, k, v = self._inputs(3, 2, 4, device, torch.float64, requires_grad)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            o, a = tanh_attention(q, k, v)
        need_q, need_k, _ = requires_grad
        expected = [t for t, keep in ((q, need_k), (k, need_q), (v, need_q or need_k)) if keep]
        self.assertEqual(len(saved), len(expected) + 1)
        self.assertTrue(all(s is t for s, t in zip(saved, expected)))
        self.assertIs(saved[-1], a)
        grads = torch.autograd.grad((o.sum() + a.sum()), [t for t in (q, k, v) if t.requires_grad])
        self.assertEqual(len(grads), sum(requires_grad))


instantiate_device_type_tests(TestTanhAttention, globals())

if __name__ == "__main__":
    run_tests()
