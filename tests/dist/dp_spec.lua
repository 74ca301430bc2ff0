-- tests/dist/dp_spec.lua: data parallelism (lt.dist.DataParallel with
-- lt.train) against one process: on every rank a reference model trains on
-- the whole global batch alone, and a data-parallel model on this rank's
-- slice; over 10 f32 AdamW steps with clipping and 2 micro-batches the
-- logged losses agree to 1e-5 relative and the weights to 1e-4. Also:
-- rank 0's weights are broadcast at the start; buckets communicate once per
-- optimizer step (not per micro-batch); bucket sizes follow bucket_mb.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

local STEPS, ACCUM, B, T = 10, 2, 2, 16

-- the global batches, the same on every rank: STEPS * ACCUM micro-batches of (B * world, T)
local function global_batches(w)
  local g = lt.Generator(99)
  local out = {}
  for i = 1, STEPS * ACCUM do
    local ids = lt.randint(0, 512, { B * w, T + 1 }, { generator = g })
    out[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  return out
end

local function loader(batches, slice)
  local i = 0
  return { next = function()
    i = i + 1
    local b = batches[i]
    if not b then return nil end
    if slice then return b[1]:narrow(1, slice[1], slice[2]):contiguous(), b[2]:narrow(1, slice[1], slice[2]):contiguous() end
    return b[1], b[2]
  end }
end

local function train(model, data, ddp)
  local losses = {}
  local opt = lt.optim.AdamW(model, { lr = 3e-3, weight_decay = 0.1 })
  lt.train { model = model, optimizer = opt, train = data, steps = STEPS, accum = ACCUM, clip = 1.0, quiet = true,
    out_dir = os.tmpname() .. "-dp", ddp = ddp, on_step = function(rec) losses[rec.step] = rec.loss end }
  return losses
end

H.test("data parallel matches one process on the same global batch (10 f32 steps, 2 micro-batches)", function(r, w)
  local batches = global_batches(w)
  local ref = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  local ref_losses = train(ref, loader(batches))
  -- a different initialisation on every rank: DataParallel must broadcast rank 0's
  local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(r == 0 and 5 or 50 + r) })
  local ddp = lt.dist.DataParallel(model, { bucket_mb = 0.05 })
  local losses = train(model, loader(batches, { r * B + 1, B }), ddp)
  for s = 1, STEPS do
    local rel = math.abs(losses[s] - ref_losses[s]) / math.abs(ref_losses[s])
    assert(rel < 1e-5, ("step %d: loss %.8f vs one process %.8f"):format(s, losses[s], ref_losses[s]))
  end
  local a, b = model:parameters(), ref:parameters()
  -- Adam divides by the gradient scale, so float reassociation in the sums moves weights by ~1e-5
  for i = 1, #a do H.close(a[i], b[i], 1e-4, "parameter " .. i) end
  -- once per optimizer step per bucket, none for the first micro-batches
  assert(ddp.stats.launched == STEPS * #ddp.buckets,
    ("%d bucket all-reduces for %d steps of %d buckets"):format(ddp.stats.launched, STEPS, #ddp.buckets))
  assert(#ddp.buckets > 1, "bucket_mb = 0.05 should make several buckets")
end)

H.test("buckets go out in the same order on every rank when a parameter is unused on one", function(r, w)
  -- two linear layers of equal size (equal buckets); rank 1 skips the second
  local a = lt.nn.Linear(8, 8, { bias = false })
  local b = lt.nn.Linear(8, 8, { bias = false })
  local params = { a.weight, b.weight }
  local ddp = lt.dist.DataParallel(params, { bucket_mb = 8 * 8 * 4 / 2 ^ 20 }) -- one parameter per bucket
  assert(#ddp.buckets == 2)
  local x = lt.ones({ 2, 8 })
  local y = a(x)
  if r ~= 1 then y = b(y) end
  y:sum():backward()
  ddp:finish()
  -- every rank: a's gradient is the sum over ranks of each rank's own; b's is the others' sum (rank 1 gave zeros)
  local ga = lt.no_grad(function() return a.weight.grad:clone() end)
  local gb = b.weight.grad and b.weight.grad:clone() or lt.zeros({ 8, 8 })
  local ref_a = lt.tensor({ ga:sum():item() }, { dtype = "f64" })
  lt.dist.broadcast(ref_a, { src = 0 })
  assert(math.abs(ga:sum():item() - ref_a:item()) < 1e-6, "a's gradient differs across ranks")
  local ref_b = lt.tensor({ gb:sum():item() }, { dtype = "f64" })
  lt.dist.broadcast(ref_b, { src = 0 })
  assert(math.abs(gb:sum():item() - ref_b:item()) < 1e-6, "b's gradient differs across ranks")
end)

H.test("DataParallel broadcasts rank 0's weights and rejects bad settings", function(r, w)
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(100 + r) })
  lt.dist.DataParallel(m)
  local ref = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(100) })
  H.close(m:parameters()[1], ref:parameters()[1], 0, "broadcast weights")
  H.raises(function() lt.dist.DataParallel(m, { bucket_mb = 0 }) end, "bucket_mb must be > 0")
  H.raises(function() lt.dist.DataParallel({}) end, "expects a model")
  local ddp = lt.dist.DataParallel(m)
  H.raises(function()
    lt.train { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }), train = loader(global_batches(w)), steps = 1,
      ddp = ddp, ckpt_every = 1, quiet = true }
  end, "checkpoints need a training loader with state() and load_state()")
end)

H.test("only rank 0 logs, unless log_all_ranks: then every rank, prefixed with its rank", function(r, w)
  local m = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 40,
    generator = lt.Generator(5) }
  local ddp = lt.dist.DataParallel(m)
  local data = { next = function() return lt.zeros({ 1, 8 }, { dtype = "i64" }), lt.zeros({ 1, 8 }, { dtype = "i64" }) end }
  for _, all in ipairs { false, true } do
    local lines, print0 = {}, print
    rawset(_G, "print", function(s) lines[#lines + 1] = s end)
    local ok, err = pcall(lt.train, { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }), train = data, steps = 2,
      ddp = ddp, out_dir = os.tmpname() .. "-logs", log_all_ranks = all })
    rawset(_G, "print", print0)
    assert(ok, err)
    if all then
      assert(#lines > 0 and lines[1]:sub(1, #("[rank " .. r .. "]")) == "[rank " .. r .. "]", tostring(lines[1]))
    elseif r == 0 then
      assert(#lines > 0 and not lines[1]:find("^%[rank"), tostring(lines[1]))
    else
      assert(#lines == 0, ("rank %d printed %d lines"):format(r, #lines))
    end
  end
end)

H.test("a DataParallel dropped with its model is freed (its gradient hooks hold neither strongly)", function(_, w)
  local alive = setmetatable({}, { __mode = "k" })
  local function one(seed)
    local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(seed) })
    local ddp = lt.dist.DataParallel(model)
    local x = lt.randint(0, 512, { 2, 8 }, { generator = lt.Generator(seed) })
    model:loss(x, x):backward()
    ddp:finish()
    alive[ddp], alive[model] = true, true
  end
  for k = 1, 5 do one(k) end
  collectgarbage()
  collectgarbage()
  local n = 0
  for _ in pairs(alive) do n = n + 1 end
  -- (a stale stack slot may keep the last one's pair: before the hooks held
  -- them weakly, all 5 pairs stayed, with their buckets)
  assert(n <= 2, ("%d of the 10 (5 DataParallels, their 5 models) are still alive after collectgarbage"):format(n))
end)

H.run("dp_spec")
