"""Surviving mutants that cannot change behaviour, each with the reason: ``EQUIVALENT[target][(operator, original
line, mutated line)] = why`` (lines stripped, as in mutation/results/*.json).  A survivor not listed here is a
missing test (kill it) or dead code (delete it; in a module another change owns, report it)."""

_TYPE = "core/ReplaceComparisonOperator_"

EQUIVALENT = {
    "sampling": {
        (_TYPE + "Eq_LtE", 'if np.dtype(dtype).kind == "c":', 'if np.dtype(dtype).kind <= "c":'):
            "the dtypes drawn are float (kind 'f') and complex ('c'): only 'c' sorts at or before 'c'",
        (_TYPE + "Eq_Is", 'if np.dtype(dtype).kind == "c":', 'if np.dtype(dtype).kind is "c":'):
            "numpy's kind is a one-character str, and CPython keeps one object per one-character str: `is` is `==`",
        (_TYPE + "LtE_Lt", "if peak <= limit:", "if peak < limit:"):
            "a draw exactly at the limit is scaled by (limit / peak) = 1: the same numbers either way",
        ("core/NumberReplacer", "limit, peak = x_limit(dtype), float(np.max(np.abs(spec.tanh_argument(*inputs)), initial=0.0))",
         "limit, peak = x_limit(dtype), float(np.max(np.abs(spec.tanh_argument(*inputs)), initial= 1.0))"):
            "peak only meets x_limit, which is above 1 for every dtype (2.44, 5.57): a peak raised to 1 passes as 0 does",
        ("core/NumberReplacer", "limit, peak = x_limit(dtype), float(np.max(np.abs(spec.tanh_argument(*inputs)), initial=0.0))",
         "limit, peak = x_limit(dtype), float(np.max(np.abs(spec.tanh_argument(*inputs)), initial= -1.0))"):
            "|x| >= 0, so -1 never wins the max of a draw; an empty draw's -1 passes the limit as 0 does",
    },
    "cases": {
        (_TYPE + "Gt_NotEq", "return [tuple(names)] + ([(n,) for n in names] if len(names) > 1 else [])",
         "return [tuple(names)] + ([(n,) for n in names] if len(names) != 1 else [])"):
            "`!= 1` differs from `> 1` only for no names, where `[(n,) for n in names]` is empty like `[]`",
    },
    "hints": {
        # kinds, ops and subsets: the closed vocabularies these lines see
        ('core/ReplaceComparisonOperator_Eq_LtE', 'Rule("both_cotangents", lambda o: bool(o.grads) and o.modes == {O_A},',
         'Rule("both_cotangents", lambda o: bool(o.grads) and o.modes <= {O_A},'):
            'modes and grads come from the same VJP failures (observe): with grads non-empty, modes is non-empty, and the only non-empty subset of a one-mode set is itself',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'Rule("o_absent", lambda o: bool(o.grads) and o.modes == {A},',
         'Rule("o_absent", lambda o: bool(o.grads) and o.modes <= {A},'):
            'modes and grads come from the same VJP failures (observe): with grads non-empty, modes is non-empty, and the only non-empty subset of a one-mode set is itself',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'Rule("a_absent", lambda o: bool(o.grads) and o.modes == {O},',
         'Rule("a_absent", lambda o: bool(o.grads) and o.modes <= {O},'):
            'modes and grads come from the same VJP failures (observe): with grads non-empty, modes is non-empty, and the only non-empty subset of a one-mode set is itself',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'return f"raises {types.pop()}" if len(types) == 1 else "fails"',
         'return f"raises {types.pop()}" if len(types) <= 1 else "fails"'):
            "_verb is called on a framework's own failures only when there is one (observe returns None first), all of which raised here: the set of error types is never empty",
        ('core/ReplaceComparisonOperator_Eq_LtE', 'own = [f for f in report.failures if f.op == "attn" and f.framework == fw and not f.cross and not f.candidate]',
         'own = [f for f in report.failures if f.op <= "attn" and f.framework == fw and not f.cross and not f.candidate]'):
            'an op is one of specs.SPECS (scores, tanh, mix, attn, attn_o, attn_o_causal): only "attn" sorts at or before "attn"',
        ('core/ReplaceComparisonOperator_GtE_Eq', 'if set(wrts) >= set(subsets(inputs)[1:]):',
         'if set(wrts) == set(subsets(inputs)[1:]):'):
            'wrts holds the wrt tuples of proper subsets only (a request with every input has wrt ()): a superset of every proper subset is that set, `==` is `>=`',
        ('core/ReplaceComparisonOperator_Is_Eq', 'vjp = [f for f in default if f.kind is Kind.VJP]',
         'vjp = [f for f in default if f.kind == Kind.VJP]'):
            "a comparison's kind is always a Kind member (Oracle.kind), and a member equals only itself: `==` is `is`",
        ('core/ReplaceComparisonOperator_Is_Eq', 'fw=fw, forward=any(f.kind is Kind.FORWARD for f in default), grads=frozenset(n for f in vjp for n in f.inputs),',
         'fw=fw, forward=any(f.kind == Kind.FORWARD for f in default), grads=frozenset(n for f in vjp for n in f.inputs),'):
            "a comparison's kind is always a Kind member (Oracle.kind), and a member equals only itself: `==` is `is`",
        ('core/ReplaceComparisonOperator_Is_Eq', 'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),',
         'jvp=any(f.kind == Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),'):
            "a comparison's kind is always a Kind member (Oracle.kind), and a member equals only itself: `==` is `is`",
        ('core/ReplaceComparisonOperator_Is_Eq', 'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),',
         'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind == Kind.VJP and f.wrt),'):
            "a comparison's kind is always a Kind member (Oracle.kind), and a member equals only itself: `==` is `is`",
        ('core/ReplaceComparisonOperator_Is_LtE', 'fw=fw, forward=any(f.kind is Kind.FORWARD for f in default), grads=frozenset(n for f in vjp for n in f.inputs),',
         'fw=fw, forward=any(f.kind <= Kind.FORWARD for f in default), grads=frozenset(n for f in vjp for n in f.inputs),'):
            'Kind is a str enum: among the kinds default keeps (forward, vjp, jvp) only "forward" sorts at or before "forward"',
        ('core/ReplaceComparisonOperator_Is_LtE', 'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),',
         'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind <= Kind.VJP and f.wrt),'):
            'only a VJP failure carries a wrt (results.Comparison: every other kind has ()): the other kinds this lets in drop out on `and f.wrt`',
        ('core/ReplaceComparisonOperator_Is_GtE', 'vjp = [f for f in default if f.kind is Kind.VJP]',
         'vjp = [f for f in default if f.kind >= Kind.VJP]'):
            'Kind is a str enum: among the kinds default keeps (forward, vjp, jvp) only "vjp" sorts at or after "vjp"',
        ('core/ReplaceComparisonOperator_Is_GtE', 'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind is Kind.VJP and f.wrt),',
         'jvp=any(f.kind is Kind.JVP for f in default), wrts=frozenset(f.wrt for f in own if f.kind >= Kind.VJP and f.wrt),'):
            'only a VJP failure carries a wrt (results.Comparison: every other kind has ()): the other kinds this lets in drop out on `and f.wrt`',
        ('core/NumberReplacer', 'return text.replace("fails only", o.verb + " only", 1)',
         'return text.replace("fails only", o.verb + " only", 2)'):
            'every row\'s text has "fails only" at most once (the quoted review titles never contain it): replacing the first two occurrences is replacing the first',
        # the return-order slips: closed vocabularies (how), and index guards one line up
        ('core/ReplaceComparisonOperator_Eq_LtE', 'grads = (" and " if how == "matches" else " or ").join(f"G_{n.upper()}" for n in whose)',
         'grads = (" and " if how <= "matches" else " or ").join(f"G_{n.upper()}" for n in whose)'):
            'how is "matches" or "shape" (Observed.slips, as slips() writes it), and "shape" sorts after "matches": `<=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'parts.append(f"what you return as g_{position} " + (f"matches {grads}" if how == "matches" else',
         'parts.append(f"what you return as g_{position} " + (f"matches {grads}" if how <= "matches" else'):
            'how is "matches" or "shape" (Observed.slips, as slips() writes it), and "shape" sorts after "matches": `<=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'right = ("the gradients themselves agree with autodiff, as " if all(how == "matches" for _, _, how in o.slips)',
         'right = ("the gradients themselves agree with autodiff, as " if all(how <= "matches" for _, _, how in o.slips)'):
            'how is "matches" or "shape" (Observed.slips, as slips() writes it), and "shape" sorts after "matches": `<=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'returned = counts.pop() if len(counts) == 1 and first_order else None',
         'returned = counts.pop() if len(counts) <= 1 and first_order else None'):
            "counts holds one entry per distinct first-order failure's count: it is empty only when first_order is, where `and first_order` is false either way",
        ('core/ReplaceComparisonOperator_Is_Eq', 'first_order = [f for f in own if f.kind is Kind.VJP]',
         'first_order = [f for f in own if f.kind == Kind.VJP]'):
            "a comparison's kind is always a Kind member (Oracle.kind), and a member equals only itself: `==` is `is`",
        ('core/NumberReplacer', 'whose = tuple(name for name, shape in f.input_shapes_named() if tuple(shape) == got and name != f.inputs[0])',
         'whose = tuple(name for name, shape in f.input_shapes_named() if tuple(shape) == got and name != f.inputs[ -1])'):
            'the line above returns None unless f.inputs has exactly one name: inputs[-1] is inputs[0]',
        ('core/NumberReplacer', 'shapes.setdefault(f.inputs[0], set(whose)).intersection_update(whose)',
         'shapes.setdefault(f.inputs[ -1], set(whose)).intersection_update(whose)'):
            'reached only when _shape_of returned a match, which needs exactly one name in f.inputs: inputs[-1] is inputs[0]',
        ('core/NumberReplacer', 'numbers.setdefault(f.inputs[0], set(f.matches)).intersection_update(f.matches)',
         'numbers.setdefault(f.inputs[ -1], set(f.matches)).intersection_update(f.matches)'):
            'the same elif requires len(f.inputs) == 1: inputs[-1] is inputs[0]',
    },
    "review_common": {
        ('core/ReplaceComparisonOperator_Eq_GtE', 'np.float32 if q.dtype == np.float64 else np.float64)), conv(v))),',
         'np.float32 if q.dtype >= np.float64 else np.float64)), conv(v))),'):
            'the review runs in a real dtype (review.review: "a real dtype it accepts"): for float32 and float64, `q.dtype >= np.float64` (float64 casts safely to it) holds for float64 only, like `==`',
        ('core/ReplaceComparisonOperator_Eq_Is', 'if p == n and sorted((m, r)) == sorted((n, d)):',
         'if p is n and sorted((m, r)) == sorted((n, d)):'):
            'sizes of at most a few units: CPython caches the ints -5..256, so equal sizes are the same object and `is` is `==`',
        ('core/ReplaceComparisonOperator_Eq_Is', 'if p == n and sorted((m, r)) == sorted((n, e)):',
         'if p is n and sorted((m, r)) == sorted((n, e)):'):
            'as for the q/k product: small ints are cached, `is` is `==`',
        ('core/ReplaceComparisonOperator_Eq_GtE', 'if raised == len(requests):',
         'if raised >= len(requests):'):
            'raised counts the requests that raised, one at most per request: never more than len(requests)',
        ('core/ReplaceComparisonOperator_Eq_Is', 'if raised == len(requests):',
         'if raised is len(requests):'):
            '21 requests: small ints are cached, `is` is `==`',
        ('core/ReplaceComparisonOperator_NotEq_Lt', 'if len(mats) != 2:',
         'if len(mats) < 2:'):
            'mats is sliced to its last two ([-2:]): never more than 2, so `< 2` is `!= 2`',
        ('core/ReplaceComparisonOperator_Lt_NotEq', 'if len(findings) < len(BAD_INPUTS):',
         'if len(findings) != len(BAD_INPUTS):'):
            'one finding at most per bad input: never more findings than BAD_INPUTS, so `!=` is `<`',
        ('core/ReplaceComparisonOperator_Lt_IsNot', 'if len(findings) < len(BAD_INPUTS):',
         'if len(findings) is not len(BAD_INPUTS):'):
            '7 bad inputs: small ints are cached, `is not` is `!=`, which is `<` here (one finding at most per bad input)',
    },
    "review_torch": {
        ('core/ReplaceComparisonOperator_Eq_LtE', 'return [mats[0][-2], mats[1][-1]] if len(mats) == 2 else None',
         'return [mats[0][-2], mats[1][-1]] if len(mats) <= 2 else None'):
            'mats is sliced to its last two ([-2:]) and every product op of _PRODUCTS (mm, bmm, addmm, baddbmm, addbmm) has two operands of two or more dims: len(mats) is 2, so `<= 2` / `>= 2` is `== 2`',
        ('core/ReplaceComparisonOperator_Eq_GtE', 'return [mats[0][-2], mats[1][-1]] if len(mats) == 2 else None',
         'return [mats[0][-2], mats[1][-1]] if len(mats) >= 2 else None'):
            'mats is sliced to its last two ([-2:]) and every product op of _PRODUCTS (mm, bmm, addmm, baddbmm, addbmm) has two operands of two or more dims: len(mats) is 2, so `<= 2` / `>= 2` is `== 2`',
        ('core/ReplaceComparisonOperator_Eq_GtE', 'big = [s for s in saved + attrs if s.name == _X or (not s.name and s.shape == (n, n))]',
         'big = [s for s in saved + attrs if s.name >= _X or (not s.name and s.shape == (n, n))]'):
            'a seen name is "" or one of q, k, v, a, x = q kᵀ, all sorting at or before _X, and _X itself comes from the same dict key object: `>=` / `is` hold for _X only, like `==`',
        ('core/ReplaceComparisonOperator_Eq_Is', 'big = [s for s in saved + attrs if s.name == _X or (not s.name and s.shape == (n, n))]',
         'big = [s for s in saved + attrs if s.name is _X or (not s.name and s.shape == (n, n))]'):
            'a seen name is "" or one of q, k, v, a, x = q kᵀ, all sorting at or before _X, and _X itself comes from the same dict key object: `>=` / `is` hold for _X only, like `==`',
        ('core/ReplaceComparisonOperator_Eq_Is', 'elif name in _PRODUCTS and product_class(shapes) == "x":',
         'elif name in _PRODUCTS and product_class(shapes) is "x":'):
            'product_class returns the literal "x" (an interned constant): `is "x"` is `== "x"`',
        ('core/ReplaceOrWithAnd', 'with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):',
         'with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) and t, lambda t: t):'):
            'the graph built under the hooks in _saved is never run backward: only the list the pack hook appends to is read, never what it returns',
        ('core/NumberReplacer', 'return events, (returned[0] if returned else None)',
         'return events, (returned[ -1] if returned else None)'):
            'the hook is on one node and one backward runs: it fires once, returned holds one entry, [-1] is [0]',
    },
    "shards_payload": {
        ('core/NumberReplacer', 'return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], str) and outcome[0] == "raised"',
         'return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[ 1], str) and outcome[0] == "raised"'):
            'an in-place probe outcome is ("raised", message: str) or the gradients (a 3-tuple, q, k, v): a 2-tuple whose first item is the str "raised" always carries a str message, so checking the type of item 1 instead of item 0 decides alike',
        ('core/NumberReplacer', 'return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[0], str) and outcome[0] == "raised"',
         'return isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[ -1], str) and outcome[0] == "raised"'):
            'an in-place probe outcome is ("raised", message: str) or the gradients (a 3-tuple, q, k, v): a 2-tuple whose first item is the str "raised" always carries a str message, so checking the type of item 1 instead of item 0 decides alike',
    },
    "shards_rows": {
        ('core/ReplaceComparisonOperator_Lt_NotEq', 'todo.append(((dtype, shape, trial, shape in paths, 0 < size <= config.jacrev_max_elements), case, size))',
         'todo.append(((dtype, shape, trial, shape in paths, 0 != size <= config.jacrev_max_elements), case, size))'):
            "a Jacobian's size is a count of elements, never negative: `0 != size` is `0 < size`",
        ('core/ReplaceComparisonOperator_Lt_IsNot', 'todo.append(((dtype, shape, trial, shape in paths, 0 < size <= config.jacrev_max_elements), case, size))',
         'todo.append(((dtype, shape, trial, shape in paths, 0 is not size <= config.jacrev_max_elements), case, size))'):
            'small ints are cached (0 and a size of a few hundred): `0 is not size` is `0 != size`, which is `0 < size` for a count',
        ('core/ReplaceTrueWithFalse', 'runs.append(torch.autograd.grad(outs, leaves, cots, allow_unused=True))',
         'runs.append(torch.autograd.grad(outs, leaves, cots, allow_unused=False))'):
            'every input reaches the outputs of the out-of-place reference (v through o, q and k through both): no gradient is unused, allow_unused changes nothing',
        ('core/NumberReplacer', 'todo.append(((dtype, shape, trial, shape in paths, 0 < size <= config.jacrev_max_elements), case, size))',
         'todo.append(((dtype, shape, trial, shape in paths, 1 < size <= config.jacrev_max_elements), case, size))'):
            "the sharded shapes' Jacobian sizes are 0 (n = 0) or at least 18 ((1, 2, 2): 6 input x 3 output elements): none is 1, so `1 < size` is `0 < size`",
        ('core/NumberReplacer', 'outs[i] = outs[i].mul_(0.5) if in_place else outs[i] * 0.5',
         'outs[i] = outs[i].mul_( 1.5) if in_place else outs[i] * 0.5'):
            'the in-place write only decides whether autograd refuses the backward (any in-place write on a saved tensor is refused, whatever the factor); the gradients compared come from the out-of-place run',
        ('core/NumberReplacer', 'outs[i] = outs[i].mul_(0.5) if in_place else outs[i] * 0.5',
         'outs[i] = outs[i].mul_( -0.5) if in_place else outs[i] * 0.5'):
            'the in-place write only decides whether autograd refuses the backward (any in-place write on a saved tensor is refused, whatever the factor); the gradients compared come from the out-of-place run',
        ('core/NumberReplacer', 'diffs = [(every, metrics.Diff(0.0, 0.0) if raises else metrics.Diff(',
         'diffs = [(every, metrics.Diff( -1.0, 0.0) if raises else metrics.Diff('):
            'a row keeps the largest rel err and max abs of its comparisons, starting at 0.0: a negative one of a comparison that agrees changes neither',
        ('core/NumberReplacer', 'diffs = [(every, metrics.Diff(0.0, 0.0) if raises else metrics.Diff(',
         'diffs = [(every, metrics.Diff(0.0, -1.0) if raises else metrics.Diff('):
            'a row keeps the largest rel err and max abs of its comparisons, starting at 0.0: a negative one of a comparison that agrees changes neither',
        ('core/NumberReplacer', 'd = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff(0.0, 0.0)',
         'd = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff( -1.0, 0.0)'):
            'a row keeps the largest rel err and max abs of its comparisons, starting at 0.0: a negative one of a comparison that agrees changes neither',
        ('core/NumberReplacer', 'd = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff(0.0, 0.0)',
         'd = metrics.Diff(math.inf, math.inf, disagreement) if disagreement else metrics.Diff(0.0, -1.0)'):
            'a row keeps the largest rel err and max abs of its comparisons, starting at 0.0: a negative one of a comparison that agrees changes neither',
    },
    "review_jax": {
        ("core/ReplaceComparisonOperator_Eq_LtE",
         "return value is not None and np.ndim(value) == 0 and bool(value == 0)",
         "return value is not None and np.ndim(value) <= 0 and bool(value == 0)"):
            "an array's ndim is never negative: `<= 0` is `== 0`",
        ("core/NumberReplacer", 'elif name == "broadcast_in_dim" and _is_zero_literal(eqn.invars[0]):',
         'elif name == "broadcast_in_dim" and _is_zero_literal(eqn.invars[ -1]):'):
            "broadcast_in_dim of static shapes (a review's are fixed) has one operand, its shape a parameter: invars[-1] is invars[0]",
        ("core/NumberReplacer", 'events.append(("zeros", [list(eqn.outvars[0].aval.shape)], use))',
         'events.append(("zeros", [list(eqn.outvars[ -1].aval.shape)], use))'):
            "broadcast_in_dim has one result: outvars[-1] is outvars[0]",
        ('core/ReplaceComparisonOperator_Eq_LtE', 'elif name == "dot_general" and product_class(shapes) == "x":',
         'elif name <= "dot_general" and product_class(shapes) == "x":'):
            'only dot_general events carry two matrix shapes; any other name let through has [] or a zero fill\'s one shape, whose product_class is None, never "x"',
        ('core/ReplaceComparisonOperator_Eq_LtE', 'if not used and any(name == "zeros" and shapes == [shape] and use == "computed"',
         'if not used and any(name <= "zeros" and shapes == [shape] and use == "computed"'):
            "only zero fills ('zeros') and dot_general events carry shapes, and a dot's two shapes never equal the one shape [shape]: letting other names through this test adds nothing",
        ('core/ReplaceComparisonOperator_Eq_LtE', 'if not used and any(name == "zeros" and shapes == [shape] and use == "computed"',
         'if not used and any(name == "zeros" and shapes == [shape] and use <= "computed"'):
            'the use of a kept event is "computed" or "returned" ("dead" ones are dropped just above): "computed" < "returned", so `<=` holds for "computed" only, like `==`',
        ('core/ReplaceComparisonOperator_Eq_GtE', 'elif name == "dot_general" and product_class(shapes) == "x":',
         'elif name >= "dot_general" and product_class(shapes) == "x":'):
            'only dot_general events carry two matrix shapes; any other name let through has [] or a zero fill\'s one shape, whose product_class is None, never "x"',
        ('core/ReplaceComparisonOperator_Eq_GtE', 'if not used and any(name == "zeros" and shapes == [shape] and use == "computed"',
         'if not used and any(name >= "zeros" and shapes == [shape] and use == "computed"'):
            "only zero fills ('zeros') and dot_general events carry shapes, and a dot's two shapes never equal the one shape [shape]: letting other names through this test adds nothing",
        ('core/ReplaceComparisonOperator_Eq_Is', 'if name == "dot_general":',
         'if name is "dot_general":'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
        ('core/ReplaceComparisonOperator_Eq_Is', 'elif name == "broadcast_in_dim" and _is_zero_literal(eqn.invars[0]):',
         'elif name is "broadcast_in_dim" and _is_zero_literal(eqn.invars[0]):'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
        ('core/ReplaceComparisonOperator_Eq_Is', 'elif name == "dot_general" and product_class(shapes) == "x":',
         'elif name is "dot_general" and product_class(shapes) == "x":'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
        ('core/ReplaceComparisonOperator_Eq_Is', 'elif name == "dot_general" and product_class(shapes) == "x":',
         'elif name == "dot_general" and product_class(shapes) is "x":'):
            'product_class returns the literal "x" (an interned constant): `is "x"` is `== "x"`',
        ('core/ReplaceComparisonOperator_Eq_Is', 'if not used and any(name == "zeros" and shapes == [shape] and use == "computed"',
         'if not used and any(name is "zeros" and shapes == [shape] and use == "computed"'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
        ('core/ReplaceComparisonOperator_Eq_Is', 'if not used and any(name == "zeros" and shapes == [shape] and use == "computed"',
         'if not used and any(name == "zeros" and shapes == [shape] and use is "computed"'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
        ('core/ReplaceComparisonOperator_NotEq_IsNot', 'events = [(name, shapes, use) for name, shapes, use in events if use != "dead"]',
         'events = [(name, shapes, use) for name, shapes, use in events if use is not "dead"]'):
            'a primitive\'s name, the event names and the use words are string constants (jax\'s Primitive("...") names, this module\'s and crosscheck.jaxpr\'s literals), which CPython interns: `is` is `==` here',
    },
    "parts": {
        (_TYPE + "Eq_LtE", 'return word if k == 1 else word + "s"', 'return word if k <= 1 else word + "s"'):
            "k is never 0 (nor negative): an op has at least one output, and an empty return is told apart ('got no outputs') before _plural counts it",
        # part names: the keys parts() gives, string literals, the only names evaluate sees (torch and JAX executors)
        (_TYPE + "Eq_LtE", 'if name == "forward":', 'if name <= "forward":'):
            'the one-callable parts are forward, forward_ref and the oracles (vjp_ref, vjp_jac, jvp_ref, vjp_vjp_ref, hvp_ref): only "forward" sorts at or before "forward"',
        (_TYPE + "Eq_Is", 'if name == "forward":', 'if name is "forward":'):
            "a part name is one of parts()' identifier-like string literals, which CPython interns like the literal \"forward\": equal names are one object, `is` is `==`",
        (_TYPE + "Eq_LtE", 'hvp = ", which the forward-over-reverse HVP needs" if name == "hvp" else ""',
         'hvp = ", which the forward-over-reverse HVP needs" if name <= "hvp" else ""'):
            'the hand-written (list) parts are vjp, jvp, vjp_vjp and hvp: only "hvp" sorts at or before "hvp"',
        (_TYPE + "Eq_Is", 'hvp = ", which the forward-over-reverse HVP needs" if name == "hvp" else ""',
         'hvp = ", which the forward-over-reverse HVP needs" if name is "hvp" else ""'):
            "a part name is one of parts()' identifier-like string literals, which CPython interns like the literal \"hvp\": equal names are one object, `is` is `==`",
        ("core/NumberReplacer", 'out["vjp"] = [lambda x, c, t, s, mask=mask, m=m: side.vjp(x, [(mask, c[m])])[0]   # one request: inputs',
         'out["vjp"] = [lambda x, c, t, s, mask=mask, m=m: side.vjp(x, [(mask, c[m])])[ -1]   # one request: inputs'):
            "a side's vjp returns one gradient tuple per request (specs.Side; every side's vjp is torch/jax_oracles.hand_vjp or _block_side's, one per request): for one request [-1] is [0]",
        ("core/NumberReplacer", 'out["jvp"] = [lambda x, c, t, s, i=i: side.jvp(x, [t[i]])[0] for i in range(len(case.tans))]',
         'out["jvp"] = [lambda x, c, t, s, i=i: side.jvp(x, [t[i]])[ -1] for i in range(len(case.tans))]'):
            "a side's jvp returns one tuple per tangent tuple (specs.Side; every side's jvp is torch/jax_oracles.hand_jvp or _block_side's, one per entry): for one tangent tuple [-1] is [0]",
        (_TYPE + "Gt_NotEq", 'if len(got) == 1 and len(want) > 1 else ""))', 'if len(got) == 1 and len(want) != 1 else ""))'):
            "want has one shape per output of the op, and every op in specs.SPECS has at least one: `!= 1` differs from `> 1` only for none",
    },
    "torch_oracles": {
        ("core/NumberReplacer", "is_complex = inputs[0].is_complex()", "is_complex = inputs[ 1].is_complex()"):
            "q, k and v share one dtype (the contract; crosscheck builds a case's inputs in its dtype): any input "
            "tells whether they are complex",
        ("core/NumberReplacer", "is_complex = inputs[0].is_complex()", "is_complex = inputs[ -1].is_complex()"):
            "q, k and v share one dtype (the contract; crosscheck builds a case's inputs in its dtype): any input "
            "tells whether they are complex",
        ("core/NumberReplacer",
         "results.append(tuple(torch.complex(*g) if is_complex else g[0] for g in re_im))",
         "results.append(tuple(torch.complex(*g) if is_complex else g[ -1] for g in re_im))"):
            "for a real input re_im holds one part per input (k = 1): its first part is its last",
    },
    "jaxpr": {
        (_TYPE + "Eq_LtE", '["dead"] * len(sub.outvars) if "dead" in results and len(set(results)) == 1',
         '["dead"] * len(sub.outvars) if "dead" in results and len(set(results)) <= 1'):
            'with "dead" in results the set has at least one member: `<= 1` is `== 1`',
        (_TYPE + "Eq_LtE", 'read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "computed"}',
         'read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use <= "computed"}'):
            'a use is "computed", "dead" or "returned" (_uses, or "returned" for a top-level output): none sorts '
            'before "computed"',
        (_TYPE + "Eq_GtE", 'returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "returned"}',
         'returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use >= "returned"}'):
            'a use is "computed", "dead" or "returned": none sorts after "returned"',
        (_TYPE + "Eq_Is", 'returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "returned"}',
         'returned = {id(v) for v, use in zip(jaxpr.outvars, uses) if use is "returned"}'):
            "the uses are this module's string literals, which CPython interns: `is` is `==`",
        (_TYPE + "Eq_Is", 'read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use == "computed"}',
         'read = {id(v) for v, use in zip(jaxpr.outvars, uses) if use is "computed"}'):
            "the uses are this module's string literals, which CPython interns: `is` is `==`",
        (_TYPE + "NotEq_IsNot", 'if not any(use != "dead" for use in results):',
         'if not any(use is not "dead" for use in results):'):
            "the uses are this module's string literals, which CPython interns: `is not` is `!=`",
        (_TYPE + "Is_Eq", 'yield from equations(sub, results if sub is body else',
         'yield from equations(sub, results if sub == body else'):
            "a Jaxpr / ClosedJaxpr compares by identity (no __eq__ of its own): `==` is `is`",
        ("core/NumberReplacer", "body = subs[0]", "body = subs[ -1]"):
            "the line before returns unless there is exactly one nested jaxpr: subs[-1] is subs[0]",
    },
    "jax_oracles": {
        ("core/ReplaceComparisonOperator_Eq_Is",
         'if spec is None or all(p is None for p in spec) or getattr(typeof(cot), "sharding", None) == want:',
         'if spec is None or all(p is None for p in spec) or getattr(typeof(cot), "sharding", None) is want:'):
            "a cotangent whose sharding equals the output's but is another object is resharded to that same "
            "sharding: the same values and the same type, so what jax.vjp receives is unchanged",
        ("core/ReplaceComparisonOperator_Eq_Is",
         'elif name == "cond":                              # one branch runs (operand 0 picks it): the worst',
         'elif name is "cond":                              # one branch runs (operand 0 picks it): the worst'):
            'a primitive\'s name is its string constant (jax\'s Primitive("cond")), which CPython interns: `is` is `==`',
        ('core/NumberReplacer',
         '_CLEAN, _RAW, _AUTODIFF = 0, 1, 2       # no dependence on the inputs / the inputs as such / through autodiff math',
         '_CLEAN, _RAW, _AUTODIFF = -1, 1, 2       # no dependence on the inputs / the inputs as such / through autodiff math'):
            'the dependence levels are _CLEAN < _RAW < _AUTODIFF, compared by order and equality only (max, ==): any increasing values serve',
        ('core/NumberReplacer',
         '_CLEAN, _RAW, _AUTODIFF = 0, 1, 2       # no dependence on the inputs / the inputs as such / through autodiff math',
         '_CLEAN, _RAW, _AUTODIFF = 0, 1, 3       # no dependence on the inputs / the inputs as such / through autodiff math'):
            'the dependence levels are _CLEAN < _RAW < _AUTODIFF, compared by order and equality only (max, ==): any increasing values serve',
        ('core/ReplaceComparisonOperator_Eq_GtE',
         'outs = [_AUTODIFF if worst == _AUTODIFF else _CLEAN] * len(eqn.outvars)',
         'outs = [_AUTODIFF if worst >= _AUTODIFF else _CLEAN] * len(eqn.outvars)'):
            'no level is above _AUTODIFF: `>=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_Is',
         'outs = [_AUTODIFF if worst == _AUTODIFF else _CLEAN] * len(eqn.outvars)',
         'outs = [_AUTODIFF if worst is _AUTODIFF else _CLEAN] * len(eqn.outvars)'):
            'the levels are the small ints 0, 1, 2, which CPython caches: `is` is `==`',
        ('core/ReplaceComparisonOperator_Eq_LtE',
         'elif name in _LAYOUT_PRIMITIVES or worst == _CLEAN:',
         'elif name in _LAYOUT_PRIMITIVES or worst <= _CLEAN:'):
            'no level is below _CLEAN: `<=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_Is',
         'elif name in _LAYOUT_PRIMITIVES or worst == _CLEAN:',
         'elif name in _LAYOUT_PRIMITIVES or worst is _CLEAN:'):
            'the levels are the small ints 0, 1, 2, which CPython caches: `is` is `==`',
        ('core/ReplaceComparisonOperator_Eq_GtE',
         'bad = [name for name, st in zip(output_names, outs) if st == _AUTODIFF]',
         'bad = [name for name, st in zip(output_names, outs) if st >= _AUTODIFF]'):
            'no level is above _AUTODIFF: `>=` is `==`',
        ('core/ReplaceComparisonOperator_Eq_Is',
         'bad = [name for name, st in zip(output_names, outs) if st == _AUTODIFF]',
         'bad = [name for name, st in zip(output_names, outs) if st is _AUTODIFF]'):
            'the levels are the small ints 0, 1, 2, which CPython caches: `is` is `==`',
        ('core/ReplaceComparisonOperator_Eq_GtE',
         'return jax.devices("gpu" if device == "cuda" else "cpu")[0]',
         'return jax.devices("gpu" if device >= "cuda" else "cpu")[0]'):
            'crosscheck\'s devices are "cpu" and "cuda" (the CLI\'s choices): "cpu" < "cuda", so only "cuda" passes',
        ('core/ReplaceComparisonOperator_Eq_Is',
         'return jax.devices("gpu" if device == "cuda" else "cpu")[0]',
         'return jax.devices("gpu" if device is "cuda" else "cpu")[0]'):
            'the device names are the CLI\'s string constants ("cpu", "cuda"), interned: `is` is `==`',
        ('core/NumberReplacer',
         'is_complex = jnp.iscomplexobj(inputs[0])',
         'is_complex = jnp.iscomplexobj(inputs[ -1])'):
            "q, k and v share one dtype (the contract; crosscheck builds a case's inputs in its dtype): any input tells whether they are complex",
        ('core/NumberReplacer',
         'is_complex = jnp.iscomplexobj(inputs[0])',
         'is_complex = jnp.iscomplexobj(inputs[ 1])'):
            "q, k and v share one dtype (the contract; crosscheck builds a case's inputs in its dtype): any input tells whether they are complex",
    },
    "torch_formulas": {},
    "jax_formulas": {},
    "metrics": {
        (_TYPE + "Eq_LtE", "if a.size == 0:", "if a.size <= 0:"):
            "an array's size is never negative",
    },
    "compare": {
        ('core/ReplaceComparisonOperator_Eq_GtE', 'subset = () if wrt is None or len(wrt) == len(spec.inputs) else tuple(wrt)',
         'subset = () if wrt is None or len(wrt) >= len(spec.inputs) else tuple(wrt)'):
            "wrt is a subset of the op's inputs (cases.subsets), never longer than them: `>=` holds only for all of them, like `==`",
        ('core/ReplaceComparisonOperator_Eq_GtE', 'all_inputs = len(wrt) == len(spec.inputs)',
         'all_inputs = len(wrt) >= len(spec.inputs)'):
            "wrt is a subset of the op's inputs (cases.subsets), never longer than them: `>=` holds only for all of them, like `==`",
        ('core/ReplaceComparisonOperator_Eq_Is', 'subset = () if wrt is None or len(wrt) == len(spec.inputs) else tuple(wrt)',
         'subset = () if wrt is None or len(wrt) is len(spec.inputs) else tuple(wrt)'):
            "two lengths of at most 3 (an op's inputs): CPython caches the ints -5..256, so equal lengths are the same object and `is` is `==`",
        ('core/ReplaceComparisonOperator_Eq_Is', 'all_inputs = len(wrt) == len(spec.inputs)',
         'all_inputs = len(wrt) is len(spec.inputs)'):
            "two lengths of at most 3 (an op's inputs): CPython caches the ints -5..256, so equal lengths are the same object and `is` is `==`",
        ('core/ReplaceComparisonOperator_Is_Eq', 'if oracle.kind is Kind.FORWARD:',
         'if oracle.kind == Kind.FORWARD:'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_Eq', 'elif oracle.kind is Kind.JVP:',
         'elif oracle.kind == Kind.JVP:'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_Eq', 'if kind is Kind.JVP:',
         'if kind == Kind.JVP:'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_Eq', 'mine = got_r.vjp if kind is Kind.VJP else got_r.jvp',
         'mine = got_r.vjp if kind == Kind.VJP else got_r.jvp'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_Eq', 'theirs = ((want_r.vjp_ref if kind is Kind.VJP else want_r.jvp_ref) if ref_only else',
         'theirs = ((want_r.vjp_ref if kind == Kind.VJP else want_r.jvp_ref) if ref_only else'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_Eq', '(want_r.vjp if kind is Kind.VJP else want_r.jvp))',
         '(want_r.vjp if kind == Kind.VJP else want_r.jvp))'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `==` is `is`',
        ('core/ReplaceComparisonOperator_Is_LtE', 'if oracle.kind is Kind.FORWARD:',
         'if oracle.kind <= Kind.FORWARD:'):
            'Kind is a str Enum whose values are forward, vjp, jvp, vjp_vjp, hvp: only "forward" sorts at or before "forward", so `<=` holds for Kind.FORWARD alone, like `is`',
        ('core/ReplaceComparisonOperator_Is_GtE', 'mine = got_r.vjp if kind is Kind.VJP else got_r.jvp',
         'mine = got_r.vjp if kind >= Kind.VJP else got_r.jvp'):
            'kind is Kind.VJP or Kind.JVP there (compare_case\'s first-order loop), and "jvp" < "vjp": `>=` holds for Kind.VJP only, like `is`',
        ('core/ReplaceComparisonOperator_Is_GtE', 'theirs = ((want_r.vjp_ref if kind is Kind.VJP else want_r.jvp_ref) if ref_only else',
         'theirs = ((want_r.vjp_ref if kind >= Kind.VJP else want_r.jvp_ref) if ref_only else'):
            'kind is Kind.VJP or Kind.JVP there (compare_case\'s first-order loop), and "jvp" < "vjp": `>=` holds for Kind.VJP only, like `is`',
        ('core/ReplaceComparisonOperator_Is_GtE', '(want_r.vjp if kind is Kind.VJP else want_r.jvp))',
         '(want_r.vjp if kind >= Kind.VJP else want_r.jvp))'):
            'kind is Kind.VJP or Kind.JVP there (compare_case\'s first-order loop), and "jvp" < "vjp": `>=` holds for Kind.VJP only, like `is`',
        ('core/NumberReplacer', 'col.compare(spec, info, own(Kind.VJP_VJP, "hand VJP of VJP", autodiff(fw, "vjp_vjp")), r.vjp_vjp[0],',
         'col.compare(spec, info, own(Kind.VJP_VJP, "hand VJP of VJP", autodiff(fw, "vjp_vjp")), r.vjp_vjp[ -1],'):
            'the second-order parts are one-element lists (parts: one VJP of the VJP / one HVP per case), so [-1] is [0]',
        ('core/NumberReplacer', 'r.vjp_vjp_ref[0], spec.outputs, labels)',
         'r.vjp_vjp_ref[ -1], spec.outputs, labels)'):
            'the second-order parts are one-element lists (parts: one VJP of the VJP / one HVP per case), so [-1] is [0]',
        ('core/NumberReplacer', 'col.compare(spec, info, own(Kind.HVP, "hand HVP", autodiff(fw, "hvp")), r.hvp[0], r.hvp_ref[0],',
         'col.compare(spec, info, own(Kind.HVP, "hand HVP", autodiff(fw, "hvp")), r.hvp[ -1], r.hvp_ref[0],'):
            'the second-order parts are one-element lists (parts: one VJP of the VJP / one HVP per case), so [-1] is [0]',
        ('core/NumberReplacer', 'col.compare(spec, info, own(Kind.HVP, "hand HVP", autodiff(fw, "hvp")), r.hvp[0], r.hvp_ref[0],',
         'col.compare(spec, info, own(Kind.HVP, "hand HVP", autodiff(fw, "hvp")), r.hvp[0], r.hvp_ref[ -1],'):
            'the second-order parts are one-element lists (parts: one VJP of the VJP / one HVP per case), so [-1] is [0]',
        # Collector.compare / _matches (the return-order slip)
        (_TYPE + "LtE_Eq", 'if not d.rel_err <= row.tol:', 'if not d.rel_err == row.tol:'):
            "matches is kept only on a failing comparison (record adds a Comparison to failures only when rel_err > tol; metrics.diff never returns NaN), where `not ==` holds as `not <=` does; on a pass the extra _matches result is dropped",
        (_TYPE + "LtE_Lt", 'if not d.rel_err <= row.tol:', 'if not d.rel_err < row.tol:'):
            "matches is kept only on a failing comparison (rel_err > tol), where `not <` holds as `not <=` does; the one value told apart, rel_err == tol, passes, and its matches are dropped",
        (_TYPE + "LtE_Is", 'if not d.rel_err <= row.tol:', 'if not d.rel_err is row.tol:'):
            "matches is kept only on a failing comparison (rel_err > tol): a float of another value is never the tolerance object, so `not is` holds as `not <=` does; on a pass the extra _matches result is dropped",
        (_TYPE + "IsNot_NotEq", 'if oracle.kind is not Kind.VJP:', 'if oracle.kind != Kind.VJP:'):
            'a kind is always a Kind member (oracles.Kind), and a member equals only itself: `!=` is `is not`',
        (_TYPE + "NotEq_IsNot", 'agree = [j for j in range(len(labels)) if j != i and not np.any(expected[j])]',
         'agree = [j for j in range(len(labels)) if j is not i and not np.any(expected[j])]'):
            "i and j index an op's inputs (at most 3): CPython caches the ints -5..256, so `is not` is `!=`",
        (_TYPE + "NotEq_IsNot", 'agree = [j for j in range(len(labels)) if j != i and np.shape(actual[i]) == np.shape(expected[j])',
         'agree = [j for j in range(len(labels)) if j is not i and np.shape(actual[i]) == np.shape(expected[j])'):
            "i and j index an op's inputs (at most 3): CPython caches the ints -5..256, so `is not` is `!=`",
        (_TYPE + "Eq_LtE", 'agree = [j for j in range(len(labels)) if j != i and np.shape(actual[i]) == np.shape(expected[j])',
         'agree = [j for j in range(len(labels)) if j != i and np.shape(actual[i]) <= np.shape(expected[j])'):
            "`<=` lets in only shapes sorting strictly after actual's, i.e. other shapes, never an absent expected gradient (its () sorts first): metrics.diff scores a shape mismatch inf, above every tolerance, so only equal shapes agree, as with `==`",
    },
}

# Code no caller reaches, found by the runs, is deleted rather than listed here: target -> [(code, why dead)].
DEAD_CODE = {"torch_formulas": [], "jax_formulas": [], "metrics": []}
