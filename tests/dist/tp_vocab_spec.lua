-- tests/dist/tp_vocab_spec.lua: lt.dist.tp's vocabulary pieces
-- (VocabParallelEmbedding, vocab_parallel_cross_entropy,
-- linear_cross_entropy) on every rank of the job -- tensor parallelism over
-- the whole world, over tp=2 groups of a mesh when the world allows, and
-- over a group of one rank -- against one process's F.embedding,
-- F.cross_entropy and F.linear_cross_entropy on the same f64 values:
-- outputs and every gradient (a rank's shard against the matching slice of
-- the whole gradient) to 1e-12; against PyTorch's cross_entropy
-- (tests/ref/tp_ce.json, from tests/ref/gen_tp.py); and bad input refused
-- on every rank.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local tp = lt.dist.tp
local F = lt.F
local TOL = 1e-12

local function groups_to_test(w)
  local out = { { "the world", lt.dist.new_group(0, lt.dist.rank()) } }
  if w % 2 == 0 and w > 2 then out[#out + 1] = { "tp=2 of a mesh", lt.dist.mesh { tp = 2 }.tp } end
  return out
end

-- rank r's k columns (dim 2 of a matrix, the last of any) or rows of a whole tensor
local function cols(t, g)
  local k = t:size(-1) / g:size()
  return t:narrow(t:dim(), g:rank() * k + 1, k):contiguous()
end
local function rows(t, g)
  local k = t:size(1) / g:size()
  return t:narrow(1, g:rank() * k + 1, k):contiguous()
end

local function randn(gen, shape) return lt.randn(shape, { dtype = "f64", generator = gen }) end
local function ids(values, shape, dtype) return lt.tensor(values, { dtype = dtype or "i64" }):view(shape) end

-- ---- the embedding --------------------------------------------------------------

H.test("VocabParallelEmbedding equals the whole nn.Embedding: rows, and the weight gradient's rows", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n = g:size()
    local V = 4 * n
    for _, dt in ipairs { "i64", "i32" } do
      local emb = lt.nn.Embedding(V, 3, { dtype = "f64", generator = lt.Generator(11) })
      local e = tp.VocabParallelEmbedding.from(emb, g)
      assert(e.weight:size(1) == 4 and e.weight:size(2) == 3, name .. ": shard shape")
      local x = ids({ 0, V - 1, 3, 3, 1, V - 2 }, { 2, 3 }, dt) -- (a repeated id: its gradient sums)
      local up = randn(lt.Generator(12), { 2, 3, 3 })
      local want = emb(x)
      ;(want * up):sum():backward()
      local got = e(x)
      assert(got:dim() == 3 and got:size(3) == 3, name .. ": output shape")
      ;(got * up):sum():backward()
      H.close(got, want, TOL, name .. " " .. dt .. ": output")
      H.close(e.weight.grad, rows(emb.weight.grad, g), TOL, name .. " " .. dt .. ": the rank's rows of the gradient")
    end
  end
end)

H.test("VocabParallelEmbedding is recorded as a shard along dim 1", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local e = tp.VocabParallelEmbedding.from(lt.nn.Embedding(2 * w, 3, { dtype = "f64" }), g)
  local plan = tp.plan(e)
  assert(plan.weight and plan.weight.dim == 1 and plan.weight.parts == 1, "records: weight along dim 1")
end)

H.test("sequence-parallel VocabParallelEmbedding: this rank's rows of the whole lookup", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n = g:size()
    local V = 2 * n
    local emb = lt.nn.Embedding(V, 4, { dtype = "f64", generator = lt.Generator(13) })
    local e = tp.VocabParallelEmbedding.from(emb, g, { sequence_parallel = true })
    local vals = {}
    for i = 1, 2 * n do vals[i] = (3 * i) % V end
    local x = ids(vals, { 2, n })
    local up = randn(lt.Generator(14), { 2 * n, 4 })
    local want = emb(x):view(2 * n, 4)
    ;(want * up):sum():backward()
    local got = e(x)
    assert(got:size(1) == 2 and got:size(2) == 4, name .. ": (N/n, C) rows")
    ;(got * rows(up, g)):sum():backward()
    H.close(got, rows(want, g), TOL, name .. ": the rank's rows of the output")
    H.close(e.weight.grad, rows(emb.weight.grad, g), TOL, name .. ": the rank's rows of the gradient")
  end
end)

-- ---- vocab_parallel_cross_entropy ---------------------------------------------------

-- whole logits (N, V) or (B, T, V) and their loss by F.cross_entropy, then
-- by the vocabulary-parallel loss on this rank's columns: loss, count and
-- the gradient of the loss weighted by up (reduction none) or of the loss
local function check_ce(name, g, logits, targets, opts, up)
  local lw = logits:detach():requires_grad_()
  local want, wc = F.cross_entropy(lw, targets, opts)
  ;(up and (want * up):sum() or want):backward()
  local ls = cols(logits, g):requires_grad_()
  local got, gc = tp.vocab_parallel_cross_entropy(ls, targets, g, opts)
  ;(up and (got * up):sum() or got):backward()
  assert(got:dim() == want:dim(), name .. ": loss shape")
  H.close(got, want, TOL, name .. ": loss")
  assert(gc == wc, ("%s: count %s, want %s"):format(name, tostring(gc), tostring(wc)))
  H.close(ls.grad, cols(lw.grad, g), TOL, name .. ": the rank's columns of the logits' gradient")
  return got, ls.grad
end

H.test("vocab_parallel_cross_entropy equals F.cross_entropy: mean, sum, none, ignored rows, (B, T, V)", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local V = 4 * g:size()
    local gen = lt.Generator(21)
    local logits = randn(gen, { 6, V })
    local t = ids({ 0, V - 1, 5, -100, 2, V / 2 }, { 6 })
    check_ce(name .. " mean", g, logits, t)
    check_ce(name .. " sum", g, logits, t, { reduction = "sum" })
    check_ce(name .. " none", g, logits, t, { reduction = "none" }, randn(gen, { 6 }))
    check_ce(name .. " ignore_index 5", g, logits, t:masked_fill(t:eq(-100), 1), { ignore_index = 5 })
    local l3 = randn(gen, { 2, 3, V }) * 30 -- (large logits: the max taken out)
    local t3 = ids({ 1, -100, V - 1, 0, 3, 2 }, { 2, 3 }, "i32")
    check_ce(name .. " (B, T, V) mean", g, l3, t3)
    check_ce(name .. " (B, T, V) none", g, l3, t3, { reduction = "none" }, randn(gen, { 2, 3 }))
    local loss = tp.vocab_parallel_cross_entropy(cols(logits, g), t, g, { count = false })
    assert(lt.is_tensor(loss) and loss:dim() == 0, name .. ": count = false returns the loss alone")
  end
end)

H.test("an all-ignored batch: loss 0, count 0, zero gradients, as F.cross_entropy", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local V = 2 * g:size()
    local logits = randn(lt.Generator(22), { 4, V })
    local t = ids({ -100, -100, -100, -100 }, { 4 })
    for _, red in ipairs { "mean", "sum", "none" } do
      local got, grad = check_ce(name .. " " .. red, g, logits, t, { reduction = red },
        red == "none" and lt.ones({ 4 }, { dtype = "f64" }) or nil)
      assert(got:abs():max():item() == 0 and grad:abs():max():item() == 0, name .. " " .. red .. ": zeros")
    end
    -- the fused head too
    local y, wt = randn(lt.Generator(23), { 4, 3 }), randn(lt.Generator(24), { V, 3 })
    local yt, ws = y:detach():requires_grad_(), rows(wt, g):requires_grad_()
    local loss, count = tp.linear_cross_entropy(tp.copy_to_region(yt, g), ws, t, g)
    loss:backward()
    assert(loss:item() == 0 and count == 0, name .. ": fused loss 0, count 0")
    assert(yt.grad:abs():max():item() == 0 and ws.grad:abs():max():item() == 0, name .. ": fused zero gradients")
  end
end)

H.test("classes: the whole V padded, the last rank's padding columns masked", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n = g:size()
    local V, classes = 4 * n, 4 * n - 3 -- (the last rank holds 3 padding columns, one real)
    local logits = randn(lt.Generator(25), { 5, V })
    local t = ids({ classes - 1, 0, -100, 2, classes - 2 }, { 5 })
    local _, grad = check_ce(name .. " mean", g, logits, t, { classes = classes })
    check_ce(name .. " none", g, logits, t, { classes = classes, reduction = "none" }, randn(lt.Generator(26), { 5 }))
    if g:rank() == n - 1 then
      assert(grad:narrow(2, 2, 3):abs():max():item() == 0, name .. ": the padding columns' gradient is zero")
    end
    -- a rank whose columns are all padding (classes within the first rank's)
    check_ce(name .. " classes 3", g, logits, ids({ 0, 2, 1, -100, 2 }, { 5 }), { classes = 3 })
  end
end)

H.test("against PyTorch's cross_entropy (tests/ref/tp_ce.json): loss and logits gradient", function(_, w)
  local fixture = require("tests.lua.helpers").load_json("tests/ref/tp_ce.json")
  local g = lt.dist.new_group(0, lt.dist.rank())
  assert(fixture.V % g:size() == 0, "the fixture's V divides by the ranks")
  local function tensor_of(e, dtype) return lt.tensor(e.values, { dtype = dtype }):view(e.shape) end
  for _, c in ipairs(fixture.cases) do
    local logits = tensor_of(c.logits, "f64")
    local t = tensor_of(c.targets, "i64")
    local ls = cols(logits, g):requires_grad_()
    local opts = { reduction = c.reduction, ignore_index = c.ignore_index }
    local loss = tp.vocab_parallel_cross_entropy(ls, t, g, opts)
    ;(c.weights and (loss * tensor_of(c.weights, "f64")):sum() or loss):backward()
    H.close(loss, tensor_of(c.loss, "f64"), TOL, c.name .. ": loss")
    H.close(ls.grad, cols(tensor_of(c.grad, "f64"), g), TOL, c.name .. ": the rank's columns of the gradient")
  end
end)

H.test("bf16 logits reduce in f32: close to the f32 loss, the gradient in bf16", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local V = 8 * g:size()
  local logits = lt.randn({ 6, V }, { generator = lt.Generator(27) }):to("bf16"):to("f32")
  local t = ids({ 0, V - 1, 5, -100, 2, 1 }, { 6 })
  local want = F.cross_entropy(logits, t)
  local lb = cols(logits, g):to("bf16"):requires_grad_()
  local got = tp.vocab_parallel_cross_entropy(lb, t, g)
  got:backward()
  assert(lb.grad.dtype == "bf16", "the gradient in the logits' dtype")
  H.close(got, want, 1e-5, "bf16 loss (f32 reductions)")
  -- the fused head: its loss f32 as F.linear_cross_entropy's, y's and the head's gradients bf16
  local y = lt.randn({ 6, 4 }, { generator = lt.Generator(28) }):to("bf16")
  local wt = lt.randn({ V, 4 }, { generator = lt.Generator(29) }):to("bf16")
  local lw = F.linear_cross_entropy(y, wt, t)
  local yb, wb = y:detach():requires_grad_(), rows(wt, g):requires_grad_()
  local lf = tp.linear_cross_entropy(tp.copy_to_region(yb, g), wb, t, g)
  lf:backward()
  assert(lf.dtype == lw.dtype and yb.grad.dtype == "bf16" and wb.grad.dtype == "bf16", "fused bf16 dtypes")
  H.close(lf, lw, 1e-5, "fused bf16 loss")
end)

H.test("the gradient buffer is used once: a second backward (retain_graph) says so", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  if g:size() == 1 then return end
  local V = 2 * g:size()
  local t = ids({ 0, V - 1, 1 }, { 3 })
  local ls = randn(lt.Generator(30), { 3, 2 }):requires_grad_()
  local loss = tp.vocab_parallel_cross_entropy(ls, t, g)
  loss:backward({ retain_graph = true })
  H.raises(function() loss:backward() end, "vocab_parallel_cross_entropy: its backward ran twice")
  local y, ws = randn(lt.Generator(31), { 3, 4 }):requires_grad_(), randn(lt.Generator(32), { 2, 4 }):requires_grad_()
  local lf = tp.linear_cross_entropy(y, ws, t, g)
  lf:backward({ retain_graph = true })
  H.raises(function() lf:backward() end, "linear_cross_entropy: its backward ran twice")
end)

-- ---- linear_cross_entropy -------------------------------------------------------------

local function check_lce(name, g, y, wt, t, opts, sp)
  local yw, ww = y:detach():requires_grad_(), wt:detach():requires_grad_()
  local want, wc = F.linear_cross_entropy(yw, ww, t, opts)
  want:backward()
  local yin = sp and rows(y:reshape(-1, y:size(-1)), g):requires_grad_() or y:detach():requires_grad_()
  local ws = rows(wt, g):requires_grad_()
  local yy = sp and tp.gather_rows(yin, g) or tp.copy_to_region(yin, g)
  local got, gc = tp.linear_cross_entropy(sp and yy:view(y:shape()) or yy, ws, t, g, opts)
  got:backward()
  H.close(got, want, TOL, name .. ": loss")
  assert(gc == wc, ("%s: count %s, want %s"):format(name, tostring(gc), tostring(wc)))
  local wy = sp and rows(yw.grad:reshape(-1, y:size(-1)), g) or yw.grad
  H.close(yin.grad, wy, TOL, name .. ": y's gradient (the ranks' partials summed by " ..
    (sp and "gather_rows" or "copy_to_region") .. ")")
  H.close(ws.grad, rows(ww.grad, g), TOL, name .. ": the rank's rows of the head's gradient")
end

H.test("linear_cross_entropy equals F.linear_cross_entropy: mean, sum, ignored rows, classes, (B, T, C), SP",
function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n = g:size()
    local V = 4 * n
    local gen = lt.Generator(31)
    local y, wt = randn(gen, { 2 * n, 5 }), randn(gen, { V, 5 })
    local vals = {}
    for i = 1, 2 * n do vals[i] = i == 2 and -100 or (5 * i) % V end
    local t = ids(vals, { 2 * n })
    check_lce(name .. " mean", g, y, wt, t)
    check_lce(name .. " sum", g, y, wt, t, { reduction = "sum" })
    check_lce(name .. " classes", g, y, wt, t:clamp(nil, V - 3), { classes = V - 2 })
    check_lce(name .. " ignore_index 0", g, y, wt, t:clamp(0, nil), { ignore_index = 0 })
    check_lce(name .. " (B, T, C)", g, y:view(2, n, 5), wt, t:view(2, n))
    check_lce(name .. " sequence parallel", g, y:view(2, n, 5), wt, t:view(2, n), nil, true)
  end
end)

H.test("a tied head: the embedding's shard as the head's weight, both gradients summed", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n = g:size()
    local V = 2 * n
    local emb = lt.nn.Embedding(V, 4, { dtype = "f64", generator = lt.Generator(41) })
    local vals, tv = {}, {}
    for i = 1, 3 * n do vals[i], tv[i] = (i * 7) % V, (i * 5 + 1) % V end
    local x, t = ids(vals, { 3 * n }), ids(tv, { 3 * n })
    local want = F.linear_cross_entropy(emb(x):tanh(), emb.weight, t)
    want:backward()
    local e = tp.VocabParallelEmbedding.from(emb, g)
    local got = tp.linear_cross_entropy(tp.copy_to_region(e(x):tanh(), g), e.weight, t, g)
    got:backward()
    H.close(got, want, TOL, name .. ": loss")
    H.close(e.weight.grad, rows(emb.weight.grad, g), TOL, name .. ": the tied weight's gradient (lookup + head)")
  end
end)

-- ---- a group of one rank ----------------------------------------------------------------

H.test("a group of one rank: each function is the one-process function exactly", function(rank)
  local one = lt.dist.new_group(rank, 0)
  assert(one:size() == 1, "a group of one")
  local gen = lt.Generator(51)
  local logits, t = randn(gen, { 4, 6 }), ids({ 0, 4, -100, 3 }, { 4 })
  for _, red in ipairs { "mean", "sum", "none" } do
    local a, b = logits:detach():requires_grad_(), logits:detach():requires_grad_()
    local la, ca = F.cross_entropy(a, t, { reduction = red, classes = 5 })
    local lb, cb = tp.vocab_parallel_cross_entropy(b, t, one, { reduction = red, classes = 5 })
    la:sum():backward()
    lb:sum():backward()
    H.close(lb, la, 0, red .. ": loss")
    assert(ca == cb, red .. ": count")
    H.close(b.grad, a.grad, 0, red .. ": gradient")
  end
  local y, wt = randn(gen, { 4, 3 }), randn(gen, { 6, 3 })
  local ya, wa, yb, wb = y:detach():requires_grad_(), wt:detach():requires_grad_(), y:detach():requires_grad_(),
    wt:detach():requires_grad_()
  local la = F.linear_cross_entropy(ya, wa, t)
  local lb = tp.linear_cross_entropy(tp.copy_to_region(yb, one), wb, t, one)
  la:backward()
  lb:backward()
  H.close(lb, la, 0, "fused: loss")
  H.close(yb.grad, ya.grad, 0, "fused: y's gradient")
  H.close(wb.grad, wa.grad, 0, "fused: the head's gradient")
  local emb = lt.nn.Embedding(6, 3, { dtype = "f64", generator = gen })
  local e = tp.VocabParallelEmbedding.from(emb, one)
  local x = ids({ 5, 0, 2, 2 }, { 2, 2 })
  emb(x):sum():backward()
  local out = e(x)
  out:sum():backward()
  H.close(out, emb(x), 0, "embedding: rows")
  H.close(e.weight.grad, emb.weight.grad, 0, "embedding: gradient")
end)

-- ---- bad input ----------------------------------------------------------------------------

H.test("bad input is refused on every rank, naming what was wrong", function(_, w)
  if w == 1 then return end -- (a group of one rank is F's functions, with their messages)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local V = 2 * w
  local logits, t = randn(lt.Generator(61), { 3, 2 }), ids({ 0, 1, V - 1 }, { 3 })
  local wrong = ids({ 0, V, 1 }, { 3 })
  local what = ("target %d at position 2 (1-based) is outside the vocabulary [0, %d)"):format(V, V)
  -- a group that is not one
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t, "tp") end, "vocab_parallel_cross_entropy",
    "expected a process group")
  H.raises(function() tp.linear_cross_entropy(logits, logits, t, nil) end, "linear_cross_entropy",
    "expected a process group")
  H.raises(function() tp.VocabParallelEmbedding.from(lt.nn.Embedding(V, 2), 3) end, "expected a process group")
  -- a target outside [0, V) (or [0, classes)), an id outside [0, V)
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, wrong, g) end, "vocab_parallel_cross_entropy", what)
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, ids({ 0, -1, 1 }, { 3 }), g) end, "target -1")
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t, g, { classes = V - 1 }) end,
    ("target %d at position 3"):format(V - 1), ("[0, %d)"):format(V - 1))
  local y, wt = randn(lt.Generator(62), { 3, 4 }), randn(lt.Generator(63), { 2, 4 })
  H.raises(function() tp.linear_cross_entropy(y, wt, wrong, g) end, "linear_cross_entropy", what)
  local e = tp.VocabParallelEmbedding.from(lt.nn.Embedding(V, 2, { dtype = "f64" }), g)
  H.raises(function() e(ids({ 1, V + 3 }, { 2 })) end, "VocabParallelEmbedding",
    ("id %d at position 2"):format(V + 3), ("[0, %d)"):format(V))
  H.raises(function() e(lt.zeros({ 2 })) end, "VocabParallelEmbedding", "ids must be an i32 or i64 tensor", "f32")
  -- mismatched shapes and options
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, ids({ 0, 1 }, { 2 }), g) end,
    "expects logits (N, V/n) and targets (N)", "[3, 2] and [2]")
  H.raises(function() tp.vocab_parallel_cross_entropy(randn(lt.Generator(1), { 2, 2, 3, 2 }), t, g) end,
    "expects logits")
  H.raises(function() tp.linear_cross_entropy(y, randn(lt.Generator(1), { 2, 5 }), t, g) end,
    "weight must be this rank's (V/n, 4) f64 rows of the head", "[2, 5]")
  H.raises(function() tp.linear_cross_entropy(y, wt, ids({ 0, 1 }, { 2 }), g) end, "expects y (N, C)")
  H.raises(function() tp.linear_cross_entropy(y, wt, t, g, { reduction = "none" }) end, "'mean' or 'sum'")
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t, g, { reduction = "avg" }) end, "reduction must be")
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t, g, { classes = 2 * V }) end,
    ("classes %d is outside [1, %d]"):format(2 * V, V))
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t, g, { ignore = 1 }) end, "unknown option 'ignore'")
  H.raises(function() tp.vocab_parallel_cross_entropy(logits, t:to("f64"), g) end, "targets must be integer")
  -- a bad target on one rank only: that rank names it, the others fail at
  -- the loss's first collective naming that rank, none waits
  local mine = lt.dist.rank() == 1 and wrong or t
  local err = H.raises(function() tp.vocab_parallel_cross_entropy(logits, mine, g) end)
  if lt.dist.rank() == 1 then
    assert(err:find(what, 1, true), "rank 1 names its target: " .. err)
  else
    assert(err:find("rank 1", 1, true), "the other ranks name rank 1: " .. err)
  end
  -- the ranks still agree after the refusals: a collective completes
  local s = lt.dist.all_reduce(lt.ones({ 1 }), { group = g })
  assert(s:item() == w, "a collective after the refusals")
  H.raises(function() tp.VocabParallelEmbedding.from(lt.nn.Embedding(2 * w + 1, 2), g) end, "VocabParallelEmbedding",
    ("vocabulary's %d rows (V) do not divide by the tensor-parallel group's %d ranks"):format(2 * w + 1, w))
end)

H.run("tests/dist/tp_vocab_spec.lua")
