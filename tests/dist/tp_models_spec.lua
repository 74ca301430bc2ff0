-- tests/dist/tp_models_spec.lua: GPT-2 and Llama (grouped-query attention)
-- split across a tensor-parallel group (lt.models.*{tp = group}), with and
-- without sequence parallelism, against the whole model in one process on
-- the same batches: the logits and every parameter's gradient of a step
-- (a rank's shard against the slice of the whole gradient) in f64 to
-- 1e-10; 10 f32 AdamW steps, with clipping that fires and without, to
-- 1e-5 relative in the loss; and at np = 4 dp = 2 x tp = 2 with each ZeRO
-- stage over the data-parallel group; GPT-2 with dropout under TP and SP:
-- one process's masks and losses, the replicated weights equal. The reference runs on every rank
-- (one process's arithmetic, no collective). Bad shapes and groups are
-- refused on every rank, naming them.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local tp = lt.dist.tp

local V, B, T = 97, 2, 8 -- (97 divides by no tp: the vocabulary is padded)
lt.dist.set_timeout(120) -- (a rank that fails inside a run leaves the others waiting: not for 600 s)

local function build(family, seed, over)
  local o = { generator = lt.Generator(seed), vocab_size = V }
  for k, v in pairs(over or {}) do o[k] = v end
  if family == "gpt2" then return lt.models.gpt2("gpt2-tiny", o) end
  return lt.models.llama("llama-tiny", o)
end

-- the whole gradient of a parameter, cut as the TP model holds it (its rows padded first)
local function as_shard(whole, p, rec, g)
  if rec and rec.dim == 1 and whole:size(1) ~= p:size(1) * g:size() then
    local z = lt.zeros({ p:size(1) * g:size(), whole:size(2) }, { dtype = whole.dtype })
    z:narrow(1, 1, whole:size(1)):copy_(whole)
    whole = z
  end
  if rec then return tp.shard(whole, rec.dim, g, "test", "%d", rec.parts) end
  return whole
end

local function batch(seed, rows)
  local g = lt.Generator(seed)
  local ids = lt.randint(0, V, { rows, T + 1 }, { generator = g }):to("i64")
  return ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous()
end

local function groups(w)
  local out = { { "tp=" .. w, lt.dist.new_group(0, lt.dist.rank()) } }
  return out
end

H.test("one step's logits, loss and every gradient equal the whole model's (f64; GPT-2, Llama; with and without SP)", function(_, w)
  for _, case in ipairs(groups(w)) do
    local gname, g = case[1], case[2]
    for _, family in ipairs { "gpt2", "llama" } do
      for _, sp in ipairs { false, true } do
        local what = ("%s %s%s"):format(family, gname, sp and " SP" or "")
        local whole = build(family, 3, { dtype = "f64" })
        local par = build(family, 3, { dtype = "f64", tp = g, sequence_parallel = sp })
        local x, y = batch(11, B)
        local lw = whole:loss(x, y)
        lw:backward()
        local lp = par:loss(x, y)
        lp:backward()
        assert(math.abs(lw:item() - lp:item()) <= 1e-12 * math.abs(lw:item()), what .. ": loss")
        H.close(par:loss(x, y, { reduction = "none" }), whole:loss(x, y, { reduction = "none" }), 1e-10,
          what .. ": per-token losses (reduction none: the padded vocabulary's columns masked)")
        assert(rawget(par, "tp_ctx").sp == sp, what .. ": sequence parallelism engaged as asked")
        H.close(par(x), whole(x), 1e-10, what .. ": logits")
        local plan, wp, checked = tp.plan(par), {}, 0
        for _, np in ipairs(whole:named_parameters()) do wp[np[1]] = np[2] end
        for _, np in ipairs(par:named_parameters()) do
          local name, p = np[1], np[2]
          assert(wp[name], what .. ": no whole parameter " .. name)
          H.close(p.grad, as_shard(wp[name].grad, p, plan[name], g), 1e-10, what .. ": gradient of " .. name)
          checked = checked + 1
        end
        assert(checked == #whole:parameters(), what .. ": every parameter compared")
        if family == "llama" then
          local how = w <= 2 and "split" or "replicated"
          local kp = par.model.layers[1].self_attn.k_proj.weight
          assert((plan["model.layers.0.self_attn.k_proj.weight"] ~= nil) == (how == "split"),
            what .. ": K/V heads " .. how)
          assert(kp:size(1) == (how == "split" and 2 * 16 / w or 2 * 16), what .. ": k_proj rows")
        end
      end
    end
  end
end)

-- 10 f32 AdamW steps of lt.train.step on the same batches; clip 0 (off) or one that fires
local STEPS = 10
local function train(model, clip, rows, pick, ddp, opt)
  opt = opt or lt.optim.AdamW(model, { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
  local S = lt.train.step.new { model = model, optimizer = opt, clip = clip, ddp = ddp }
  local losses, norms = {}, {}
  for step = 1, STEPS do
    local r = S:run(step, function()
      local x, y = batch(100 + step, rows)
      if pick then x, y = pick(x), pick(y) end
      return x, y
    end)
    losses[step], norms[step] = r.loss, r.grad_norm
  end
  return losses, norms
end

-- nil, or what differs from one process (checked after the runs: a rank
-- that raised inside them would leave the others waiting in a collective)
local function same_run(what, lw, nw, lp, np_, clip)
  for s = 1, STEPS do
    if not (math.abs(lw[s] - lp[s]) <= 1e-5 * math.abs(lw[s])) then
      return ("%s: step %d loss %.9g, one process %.9g"):format(what, s, lp[s], lw[s])
    end
    if not (math.abs(nw[s] - np_[s]) <= 1e-4 * math.abs(nw[s])) then
      return ("%s: step %d gradient norm %.9g, one process %.9g"):format(what, s, np_[s], nw[s])
    end
  end
  if clip > 0 then
    local fired = false
    for s = 1, STEPS do fired = fired or nw[s] > clip end
    if not fired then return what .. ": the clip never fired" end
  end
end

H.test("10 f32 steps: the losses and gradient norms of one process, with clipping firing and not", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local bad = {}
  for _, family in ipairs { "gpt2", "llama" } do
    for _, sp in ipairs { false, true } do
      for _, clip in ipairs { 0, 0.5 } do
        local what = ("%s tp=%d%s clip %g"):format(family, w, sp and " SP" or "", clip)
        local lw, nw = train(build(family, 5), clip, B)
        local par = build(family, 5, { tp = g, sequence_parallel = sp })
        local lp, np_ = train(par, clip, B)
        bad[#bad + 1] = same_run(what, lw, nw, lp, np_, clip)
        local ok, err = pcall(tp.check_replicated, par)
        if not ok then bad[#bad + 1] = what .. ": " .. tostring(err) end
      end
    end
  end
  assert(#bad == 0, table.concat(bad, "; "))
end)

H.test("GPT-2 with dropout: one process's masks, losses and norms, with and without SP; replicated weights stay equal",
  function(_, w)
    local g = lt.dist.new_group(0, lt.dist.rank())
    local bad = {}
    lt.manual_seed(21)
    local lw, nw = train(build("gpt2", 5, { dropout = 0.2 }), 0, B)
    for _, sp in ipairs { false, true } do
      local what = ("gpt2 dropout 0.2 tp=%d%s"):format(w, sp and " SP" or "")
      lt.manual_seed(21) -- (every rank's default generator as the one process's)
      local par = build("gpt2", 5, { dropout = 0.2, tp = g, sequence_parallel = sp })
      local lp, np_ = train(par, 0, B)
      bad[#bad + 1] = same_run(what, lw, nw, lp, np_, 0)
      local ok, err = pcall(tp.check_replicated, par)
      if not ok then bad[#bad + 1] = what .. ": " .. tostring(err) end
    end
    assert(#bad == 0, table.concat(bad, "; "))
  end)

-- (a layout of 4 ranks: registered only in a job of 4, so no other job counts it as passed)
local _, world = lt.dist.init()
if world == 4 then H.test("dp=2 x tp=2 with ZeRO stages 0-3 over the data-parallel group: one process's losses", function(r, w)
  local bad = {}
  local mesh = lt.dist.mesh { tp = 2 }
  local d = mesh.coords.dp
  local pick = function(t) return t:narrow(1, d * B + 1, B):contiguous() end
  local lw, nw = train(build("gpt2", 6), 0.5, 2 * B)
  for stage = 0, 3 do
    local what = ("gpt2 dp=2 x tp=2 ZeRO %d"):format(stage)
    local par = build("gpt2", 6, { tp = mesh.tp })
    local ddp = lt.dist.DataParallel(par, { gradients = stage >= 2 and "none" or "all_reduce", group = mesh.dp })
    local settings = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
    local opt
    if stage == 0 then opt = lt.optim.AdamW(par, settings)
    else
      settings.stage, settings.group = stage, mesh.dp
      opt = lt.dist.Zero(par, settings)
    end
    local lp, np_ = train(par, 0.5, 2 * B, pick, ddp, opt)
    bad[#bad + 1] = same_run(what, lw, nw, lp, np_, 0.5)
    if stage == 3 then opt:unshard() end
    local ok, err = pcall(tp.check_replicated, par)
    if not ok then bad[#bad + 1] = what .. ": " .. tostring(err) end
    if stage == 3 then opt:reshard() end
  end
  assert(#bad == 0, table.concat(bad, "; "))
end) end

H.test("evaluation under no_grad keeps nothing: the vocab-parallel loss's buffers go with each call", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local par = build("gpt2", 3, { tp = g, vocab_size = 4096 })
  local x, y = batch(13, B)
  local function eval() return lt.no_grad(function() return par:loss(x, y):item() end) end
  eval()
  collectgarbage()
  collectgarbage()
  local before = lt.memory_stats().allocated
  for _ = 1, 5 do eval() end
  collectgarbage()
  collectgarbage()
  local grew = lt.memory_stats().allocated - before
  assert(grew < 2 ^ 20, ("5 evaluations left %d bytes behind"):format(grew))
end)

H.test("shapes that do not split, groups that are not groups, TP ranks on different batches: clear errors on every rank", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  H.raises(function() lt.models.gpt2("gpt2-tiny", { n_head = 2 * w + 1, n_embd = 8 * (2 * w + 1), tp = g }) end,
    "n_head " .. (2 * w + 1), "does not divide by tp " .. w)
  H.raises(function() lt.models.llama("llama-tiny", { ffn_dim = 8 * w + 1, tp = g }) end,
    "ffn_dim", "does not divide by tp " .. w)
  H.raises(function() lt.models.llama("llama-tiny", { n_heads = 12, n_kv_heads = 3, dim = 96, tp = g }) end,
    "n_kv_heads 3", "neither be split", "nor replicated")
  H.raises(function() lt.models.gpt2("gpt2-tiny", { tp = "two" }) end, "tp must be a process group")
  H.raises(function() lt.models.gpt2("gpt2-tiny", { sequence_parallel = true }) end,
    "gpt2: sequence_parallel splits the tokens across a tensor-parallel group: it needs tp")
  H.raises(function() lt.models.llama("llama-tiny", { tp = g, sequence_parallel = "yes" }) end,
    "llama: sequence_parallel must be true or false, got yes")
  -- an id in the padding of the vocabulary (97 ids, 98 or 100 rows): refused as one process refuses it
  for _, family in ipairs { "gpt2", "llama" } do
    local par = build(family, 3, { tp = g })
    local ids = lt.tensor({ { 1, 2, V } }, { dtype = "i64" })
    H.raises(function() par(ids) end, "id 97 at position 3 (1-based) of the ids is outside the vocabulary [0, 97)")
  end
  H.raises(function() tp.VocabParallelEmbedding.from(lt.nn.Embedding(8, 2), g, { vocab = 9 }) end,
    "vocab must be a whole number in 1..8 (the rows), got 9")
  -- dp x tp without a DataParallel: each replica would train alone; refused on every rank
  if w == 4 then
    local mesh = lt.dist.mesh { tp = 2 }
    local m = build("gpt2", 3, { tp = mesh.tp })
    H.raises(function() lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }) } end,
      "train.step: the model is tensor-parallel over 2 of the job's 4 ranks", "ddp = lt.dist.DataParallel")
  end
  -- TP ranks given different batches (a loader split by the job's ranks): refused on every rank at the first step
  local m = build("gpt2", 3, { tp = g })
  local S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }) }
  H.raises(function() S:run(1, function() return batch(50 + lt.dist.rank(), B) end) end,
    "the tensor-parallel ranks read different batches", "lt.data.shards{rank = mesh.coords.dp")
  -- a batch whose tokens do not divide by tp runs without sequence parallelism, with the same result
  local par = build("gpt2", 3, { dtype = "f64", tp = g, sequence_parallel = true })
  local whole = build("gpt2", 3, { dtype = "f64" })
  local x = batch(4, 1):narrow(2, 1, 3):contiguous()
  if (3 % w) ~= 0 then
    H.close(par(x), whole(x), 1e-10, "3 tokens")
    assert(rawget(par, "tp_ctx").sp == false, "3 tokens: no sequence parallelism")
  end
end)

H.run("tests/dist/tp_models_spec.lua")
