-- tests/dist/zero_spec.lua: ZeRO stages 1, 2 and 3 (lt.dist.Zero) against
-- plain data parallelism: the same global batches, 10 f32 AdamW steps with
-- clipping and 2 micro-batches give the same logged losses (1e-5 relative)
-- and weights (1e-4); each rank holds about 1/world of the optimizer state
-- (moments) that data parallelism holds on every rank, and the bytes of
-- parameters, gradients and optimizer state per rank shrink stage by stage
-- (stage 3: about 1/world of data parallelism's).
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

local STEPS, ACCUM, B, T = 10, 2, 2, 16

local function batches(w, r)
  local g = lt.Generator(77)
  local out = {}
  for i = 1, STEPS * ACCUM do
    local ids = lt.randint(0, 512, { B * w, T + 1 }, { generator = g })
    local mine = ids:narrow(1, r * B + 1, B)
    out[i] = { mine:narrow(2, 1, T):contiguous(), mine:narrow(2, 2, T):contiguous() }
  end
  return H.loader(out)
end

local function run(stage, r, w)
  local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  local ddp = lt.dist.DataParallel(model, { gradients = stage >= 2 and "none" or "all_reduce" })
  local settings = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if stage == 0 then
    opt = lt.optim.AdamW(model, settings)
  else
    settings.stage = stage
    opt = lt.dist.Zero(model, settings)
  end
  local losses, norms, mem = {}, {}, nil
  lt.train { model = model, optimizer = opt, train = batches(w, r), steps = STEPS, accum = ACCUM, clip = 0.5,
    quiet = true, out_dir = os.tmpname() .. "-zero", ddp = ddp,
    on_step = function(rec)
      losses[rec.step], norms[rec.step] = rec.loss, rec.grad_norm
      if rec.step == STEPS then mem = lt.dist.memory_bytes(model, opt, ddp) end -- after the last update
    end }
  if opt.unshard then opt:unshard() end -- ZeRO 3: whole parameters for the comparison
  local bytes = 0
  if stage == 0 then
    for _, s in pairs(opt.state) do
      for _, t in pairs(s) do if type(t) ~= "boolean" then bytes = bytes + t:numel() * 4 end end
    end
  else
    bytes = opt:state_bytes()
  end
  return model, losses, norms, bytes, mem
end

H.test("ZeRO stages 1, 2 and 3 match data parallelism and shard the optimizer state", function(r, w)
  local ref, ref_losses, ref_norms, ref_bytes, ref_mem = run(0, r, w)
  local mems = { [0] = ref_mem }
  for _, stage in ipairs { 1, 2, 3 } do
    local model, losses, norms, bytes, mem = run(stage, r, w)
    mems[stage] = mem
    for s = 1, STEPS do
      local rel = math.abs(losses[s] - ref_losses[s]) / ref_losses[s]
      assert(rel < 1e-5, ("stage %d step %d: loss %.8f vs %.8f"):format(stage, s, losses[s], ref_losses[s]))
      assert(math.abs(norms[s] - ref_norms[s]) < 1e-4 * ref_norms[s], ("stage %d step %d: norm %.8f vs %.8f")
        :format(stage, s, norms[s], ref_norms[s]))
    end
    local a, b = model:parameters(), ref:parameters()
    for i = 1, #a do H.close(a[i], b[i], 1e-4, ("stage %d parameter %d"):format(stage, i)) end
    -- each rank: its chunk of every flat group, so about 1/world (stage 3
    -- pads each unit's groups to a multiple of the ranks: a few elements)
    local slack = stage == 3 and 2 * 4 * w * 2 * #model:parameters() or 64
    assert(bytes <= ref_bytes / w + slack, ("stage %d: %d bytes of state on rank %d, data parallel %d"):format(stage,
      bytes, r, ref_bytes))
    local total = lt.tensor({ bytes }, { dtype = "f64" })
    lt.dist.all_reduce(total)
    assert(total:item() >= ref_bytes and total:item() <= ref_bytes + w * slack,
      ("the ranks' state adds up to %d, not %d"):format(total:item(), ref_bytes))
  end
  -- bytes per rank after the last update (f32 AdamW; P = the parameters' bytes):
  -- stage 0 P + P + 2P; stages 1-2 P + P/w + 3P/w (moments and the chunk's
  -- copy); stage 3 P/w + P/w + 2P/w
  local P, pad = ref_mem.params, 4 * w * 2 * #ref:parameters()
  local function near(v, want, what)
    assert(math.abs(v - want) <= pad, ("%s: %d bytes, expected about %d"):format(what, v, want))
  end
  near(ref_mem.grads, P, "stage 0 gradients")
  near(ref_mem.optimizer, 2 * P, "stage 0 optimizer state")
  for stage = 1, 3 do
    local m = mems[stage]
    near(m.params, stage == 3 and P / w or P, ("stage %d parameters"):format(stage))
    near(m.grads, P / w, ("stage %d gradients"):format(stage))
    near(m.optimizer, (stage == 3 and 2 or 3) * P / w, ("stage %d optimizer state"):format(stage))
  end
  local ratio = mems[3].total / ref_mem.total
  assert(ratio <= 1 / w + 0.01, ("stage 3 holds %.3f of data parallelism's bytes on %d ranks"):format(ratio, w))
  if r == 0 then
    print(("# bytes per rank on %d ranks (params / grads / optimizer / total):"):format(w))
    for stage = 0, 3 do
      local m = mems[stage]
      print(("#   stage %d: %d / %d / %d / %d"):format(stage, m.params, m.grads, m.optimizer, m.total))
    end
  end
end)

H.test("Zero rejects bad settings", function()
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) })
  H.raises(function() lt.dist.Zero(m, { stage = 4 }) end, "stage must be 1, 2 or 3")
  H.raises(function() lt.dist.Zero(m, { stage = 1, optimizer = "Lion" }) end, "optimizer must be AdamW or SGD")
  H.raises(function() lt.dist.DataParallel(m, { gradients = "sum" }) end, "gradients must be")
  local data = { next = function() return lt.zeros({ 1, 4 }, { dtype = "i64" }), lt.zeros({ 1, 4 }, { dtype = "i64" }) end }
  for _, case in ipairs { { 2, "all_reduce", "needs DataParallel{gradients = \"none\"}" },
    { 1, "none", "needs DataParallel{gradients = \"all_reduce\"}" } } do
    H.raises(function()
      lt.train { model = m, optimizer = lt.dist.Zero(m, { stage = case[1] }), train = data, steps = 1, quiet = true,
        ddp = lt.dist.DataParallel(m, { gradients = case[2] }) }
    end, case[3])
  end
  H.raises(function()
    lt.train { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }), train = data, steps = 1, quiet = true,
      ddp = lt.dist.DataParallel(m, { gradients = "none" }) }
  end, "leaves gradients unreduced")
end)

H.test("ZeRO 3: dropped parameters are named when used, and unshard brings them back", function()
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) })
  local before = m.transformer.wte.weight:clone()
  local opt = lt.dist.Zero(m, { stage = 3, lr = 0.1 })
  assert(not m.transformer.wte.weight.has_data, "the root's parameters are dropped")
  H.raises(function() return m.transformer.wte.weight:sum() end, "has no data", "opt:unshard()")
  H.raises(function() m:state_dict().x = nil; lt.save(os.tmpname(), m:state_dict()) end, "has no data")
  opt:unshard()
  H.close(m.transformer.wte.weight, before, 0, "gathered weights")
  opt:reshard()
  local data = { next = function() return lt.zeros({ 1, 4 }, { dtype = "i64" }), lt.zeros({ 1, 4 }, { dtype = "i64" }) end }
  H.raises(function()
    lt.train { model = m, optimizer = opt, train = data, steps = 1, quiet = true,
      ddp = lt.dist.DataParallel(m, { gradients = "all_reduce" }) }
  end, "needs DataParallel{gradients = \"none\"}")
  H.raises(function() lt.dist.Zero(lt.models.gpt2("gpt2-tiny"), { stage = 3, units = { 1 } }) end, "units[1] is not a module")
  local g = lt.models.gpt2("gpt2-tiny")
  H.raises(function() lt.dist.Zero(g, { stage = 3, units = { g.transformer.h[1], g.transformer.h[1] } }) end,
    "units[2] (model.transformer.h.0) is listed twice")
  local other = lt.models.gpt2("gpt2-tiny")
  H.raises(function() lt.dist.Zero(g, { stage = 3, units = { other.transformer.h[1] } }) end,
    "holds a parameter the model does not")
  local z = lt.dist.Zero(g, { stage = 3, units = g.transformer.h }) -- a ModuleList: its blocks
  assert(#z.units == 1 + g.transformer.h:len(), #z.units .. " units from a ModuleList")
  H.raises(function() lt.dist.Zero(g, { stage = 3 }) end, "already sharded by another ZeRO-3 optimizer")
end)

-- a named tiny model (lt.models' gpt2-tiny, llama-tiny; "+tied": tie_embeddings) and SGD, plain
-- (stage 0) or under ZeRO 3
local function model_opt(name, stage)
  local base = name:gsub("%+tied$", "")
  local m = lt.models[base:match("^%a+%d?")](base, { generator = lt.Generator(2), tie_embeddings = base ~= name or nil })
  local opt = stage == 3 and lt.dist.Zero(m, { stage = 3, optimizer = "SGD", lr = 0.5 })
    or lt.optim.SGD(m, { lr = 0.5 })
  return m, opt
end

H.test("ZeRO 3 without lt.train: forward, backward and step by hand; evaluation under no_grad", function(r, w)
  local x = lt.randint(0, 512, { 2, 8 }, { generator = lt.Generator(4 + r) })
  local m0, o0 = model_opt("gpt2-tiny", 0)
  local m3, o3 = model_opt("gpt2-tiny", 3)
  local ddp = lt.dist.DataParallel(m0)
  for step = 1, 3 do
    local l0 = lt.F.cross_entropy(m0(x), x)
    l0:backward()
    ddp:finish()
    o0:step(); o0:zero_grad()
    local l3 = lt.F.cross_entropy(m3(x), x)
    l3:backward()
    o3:reduce_gradients()
    o3:step(); o3:zero_grad()
    assert(math.abs(l0:item() - l3:item()) < 1e-5, ("step %d: %g vs %g"):format(step, l3:item(), l0:item()))
  end
  local e0 = lt.no_grad(function() return lt.F.cross_entropy(m0(x), x):item() end)
  local e3 = lt.no_grad(function() return lt.F.cross_entropy(m3(x), x):item() end)
  assert(math.abs(e0 - e3) < 1e-5, ("evaluation: %g vs %g"):format(e3, e0))
  assert(not m3.transformer.h[1].attn.c_attn.weight.has_data, "dropped after a forward without gradients")
end)

H.test("ZeRO 3: model:loss runs the head and the loss as one op, as without ZeRO, and trains the same", function(r, w)
  local F = lt.F
  local fused, calls = F.linear_cross_entropy, 0
  F.linear_cross_entropy = function(...) -- (counted: the two-op path keeps the (B T, V) logits)
    calls = calls + 1
    return fused(...)
  end
  local ok, err = pcall(function()
    for _, name in ipairs { "gpt2-tiny", "llama-tiny", "llama-tiny+tied" } do
      local x = lt.randint(0, 256, { 2, 8 }, { generator = lt.Generator(4 + r) })
      local m0, o0 = model_opt(name, 0)
      local m3, o3 = model_opt(name, 3)
      local ddp = lt.dist.DataParallel(m0)
      for step = 1, 2 do
        calls = 0
        local l0 = m0:loss(x, x)
        l0:backward()
        ddp:finish()
        o0:step(); o0:zero_grad()
        local l3 = m3:loss(x, x)
        assert(calls == 2, ("%s step %d: %d fused head+loss calls of 2"):format(name, step, calls))
        l3:backward()
        o3:reduce_gradients()
        o3:step(); o3:zero_grad()
        assert(math.abs(l0:item() - l3:item()) < 1e-5, ("%s step %d: %g vs %g"):format(name, step, l3:item(), l0:item()))
      end
    end
  end)
  F.linear_cross_entropy = fused
  assert(ok, err)
end)

H.test("ZeRO 3 gathers one unit at a time, prefetches the next, and drops each after use", function(r, w)
  local m = lt.models.gpt2 { n_layer = 4, n_head = 2, n_embd = 32, block_size = 16, vocab_size = 64,
    generator = lt.Generator(3) }
  local opt = lt.dist.Zero(m, { stage = 3, optimizer = "SGD", lr = 0.1 })
  local st = opt.stats
  assert(#opt.units == 5, "the root and 4 blocks")
  local root, block = opt.units[1].bytes, opt.units[2].bytes
  local x = lt.randint(0, 64, { 2, 16 }, { generator = lt.Generator(r) })
  local function step()
    lt.F.cross_entropy(m(x), x):backward()
    opt:reduce_gradients()
    opt:step()
    opt:zero_grad()
  end
  step() -- records the order
  local g0, p0, rs0 = st.gathers, st.prefetches, st.reduce_scatters
  st.peak_param_bytes = 0
  step()
  -- forward: the root and 4 blocks, each block prefetched by the one before;
  -- backward: the 4 blocks again (the root stays), 3 of them prefetched
  assert(st.gathers - g0 == 9, ("%d gathers in a step"):format(st.gathers - g0))
  assert(st.prefetches - p0 == 7, ("%d prefetches in a step"):format(st.prefetches - p0))
  local flats = 0
  for _, u in ipairs(opt.units) do flats = flats + #u.flats end
  assert(st.reduce_scatters - rs0 == flats, ("%d reduce_scatters, %d flat groups"):format(st.reduce_scatters - rs0, flats))
  assert(st.peak_param_bytes <= root + 2 * block and st.peak_param_bytes < root + 4 * block,
    ("at most %d bytes of whole parameters at once: root %d, block %d"):format(st.peak_param_bytes, root, block))
  assert(st.param_bytes == 0, "every parameter dropped after the step")
end)

-- a tiny GPT-2 with 3 blocks, under ZeRO 3 (SGD) or plain SGD with DataParallel
local function pair(extra)
  local function make()
    local cfg = { n_layer = 3, n_head = 2, n_embd = 16, block_size = 16, vocab_size = 40, generator = lt.Generator(5) }
    for k, v in pairs(extra or {}) do cfg[k] = v end
    return lt.models.gpt2(cfg)
  end
  local m0, m3 = make(), make()
  return m0, lt.optim.SGD(m0, { lr = 0.5, weight_decay = 0.1 }), lt.dist.DataParallel(m0),
    m3, lt.dist.Zero(m3, { stage = 3, optimizer = "SGD", lr = 0.5, weight_decay = 0.1 })
end

local function same_params(m0, o3, m3, what)
  o3:unshard()
  local a, b = m0:parameters(), m3:parameters()
  for i = 1, #a do H.close(a[i], b[i], 2e-5, what .. ": parameter " .. i) end -- sums in another order
  o3:reshard()
end

H.test("ZeRO 3 and DataParallel: two backwards before a step add up (retain_graph, two losses)", function(r, w)
  local m0, o0, ddp, m3, o3 = pair()
  for step = 1, 3 do
    local x = lt.randint(0, 40, { 2, 8 }, { generator = lt.Generator(10 + r + step) })
    local y = lt.randint(0, 40, { 2, 8 }, { generator = lt.Generator(20 + r + step) })
    local l0 = lt.F.cross_entropy(m0(x), x)
    l0:backward(nil, { retain_graph = true })
    l0:backward()
    lt.F.cross_entropy(m0(y), y):backward()
    ddp:finish(); o0:step(); o0:zero_grad()
    local l3 = lt.F.cross_entropy(m3(x), x)
    local l3b = lt.F.cross_entropy(m3(y), y) -- two forwards, then their backwards
    l3:backward(nil, { retain_graph = true })
    l3:backward()
    l3b:backward()
    o3:reduce_gradients(); o3:step(); o3:zero_grad()
  end
  same_params(m0, o3, m3, "after 3 steps of 3 backwards each")
  assert(o3.stats.param_bytes == 0, "parameters left gathered after the steps")
end)

H.test("ZeRO 3: a forward without backward, one that raises, or a discarded backward leave nothing stale", function(r, w)
  local m0, o0, ddp, m3, o3 = pair()
  local function x(seed) return lt.randint(0, 40, { 2, 8 }, { generator = lt.Generator(seed + r) }) end
  for step = 1, 3 do
    -- a gradient-recording forward whose loss is only looked at
    lt.F.cross_entropy(m0(x(step)), x(step)):item()
    lt.F.cross_entropy(m3(x(step)), x(step)):item()
    -- a forward that raises (longer than the context)
    assert(not pcall(m0, lt.cat({ x(step), x(step), x(step) }, 2)))
    assert(not pcall(m3, lt.cat({ x(step), x(step), x(step) }, 2)))
    -- a backward thrown away by zero_grad
    lt.F.cross_entropy(m0(x(50 + step)), x(50 + step)):backward()
    o0:zero_grad()
    lt.F.cross_entropy(m3(x(50 + step)), x(50 + step)):backward()
    o3:zero_grad()
    lt.F.cross_entropy(m0(x(step)), x(step)):backward()
    ddp:finish(); o0:step(); o0:zero_grad()
    lt.F.cross_entropy(m3(x(step)), x(step)):backward()
    o3:reduce_gradients(); o3:step(); o3:zero_grad()
  end
  same_params(m0, o3, m3, "after the odd steps")
end)

H.test("frozen parameters stay as they are under ZeRO 1, 2 and 3 (weight decay too) and DataParallel takes them", function(r, w)
  for _, stage in ipairs { 0, 1, 2, 3 } do
    local m = lt.models.gpt2 { n_layer = 2, n_head = 2, n_embd = 16, block_size = 16, vocab_size = 40,
      generator = lt.Generator(5) }
    m.transformer.wpe.weight.requires_grad = false
    local before = m.transformer.wpe.weight:clone()
    local ddp = lt.dist.DataParallel(m, { gradients = stage >= 2 and "none" or "all_reduce" })
    local opt = stage == 0 and lt.optim.AdamW(m, { lr = 1e-2, weight_decay = 0.1 })
      or lt.dist.Zero(m, { stage = stage, lr = 1e-2, weight_decay = 0.1 })
    local xs = lt.randint(0, 40, { 2, 9 }, { generator = lt.Generator(r) })
    local data = { next = function() return xs:narrow(2, 1, 8):contiguous(), xs:narrow(2, 2, 8):contiguous() end }
    lt.train { model = m, optimizer = opt, train = data, steps = 3, quiet = true, ddp = ddp, out_dir = os.tmpname() .. "-frozen" }
    if opt.unshard then opt:unshard() end
    H.close(m.transformer.wpe.weight, before, 0, ("stage %d: the frozen embedding"):format(stage))
  end
end)

H.test("all_gather into an out of the wrong size on one rank: it raises, the job carries on", function(r, w)
  if w < 2 then return end
  local out = lt.empty({ r == 1 and 3 or 2 * w })
  local ok, err = pcall(lt.dist.all_gather, lt.ones(2), { out = out })
  if r == 1 then assert(not ok and err:find("out holds 3 elements, the result needs " .. 2 * w, 1, true), tostring(err))
  else assert(ok, tostring(err)) end
  local t = lt.ones(3)
  lt.dist.all_reduce(t)
  assert(t:totable()[1] == w)
end)

H.test("a metrics directory that rank 0 cannot make stops every rank, not only rank 0", function(r, w)
  local m = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 40,
    generator = lt.Generator(5) }
  local ddp = lt.dist.DataParallel(m)
  local blocker = os.tmpname() -- a file where rank 0's directory would go
  local data = { next = function() return lt.zeros({ 1, 8 }, { dtype = "i64" }), lt.zeros({ 1, 8 }, { dtype = "i64" }) end }
  H.raises(function()
    lt.train { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }), train = data, steps = 1, quiet = true, ddp = ddp,
      out_dir = r == 0 and blocker or "/tmp", name = "x" }
  end, r == 0 and "cannot create the directory" or "rank 0 could not open the metrics file")
  -- the job goes on in step
  local t = lt.ones(2)
  lt.dist.all_reduce(t)
  assert(t:totable()[1] == w)
end)

H.test("a ZeRO-3 optimizer dropped with its model is freed (its gradient hooks hold it weakly)", function(_, w)
  local alive = setmetatable({}, { __mode = "k" })
  local function one(seed)
    local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(seed) })
    local opt = lt.dist.Zero(model, { stage = 3, lr = 1e-3 })
    local x = lt.randint(0, 512, { 2, 8 }, { generator = lt.Generator(seed) })
    model:loss(x, x):backward()
    opt:step()
    opt:zero_grad()
    alive[opt] = true
  end
  for k = 1, 8 do one(k) end
  collectgarbage()
  collectgarbage()
  local n = 0
  for _ in pairs(alive) do n = n + 1 end
  -- (the last few may wait for lazily collected autograd contexts: before
  -- the hooks held it weakly, every one stayed, with its parameters)
  assert(n <= 4, ("%d of the 8 ZeRO-3 optimizers are still alive after collectgarbage"):format(n))
end)

H.run("zero_spec")
