-- tests/dist/pp_break_spec.lua: pipeline parallelism given bad inputs and
-- odd layouts (pp = the job's ranks; np=2 and np=4). Every training result
-- is checked against the whole model trained by lt.train.step in this
-- rank on the same micro-batches (f32; losses and norms to 1e-5 relative,
-- weights to 1e-5 absolute, as tests/dist/pp_spec.lua); every refusal
-- raises on every rank, naming what was wrong, instead of a hang (the
-- watchdog is set to 60 s: a hang fails the job):
--   - a first stage with nothing to train (its embedding and blocks frozen,
--     an untied head: its optimizer has no parameter), a last stage with
--     nothing to train and a frozen block in the middle train as one process
--   - micro-batches whose B and T change between steps (the link agrees a
--     shape per B x T) train as one process
--   - a step whose micro-batches differ in shape, and a rank holding
--     another shape than its neighbours (at step 2, after the first step's
--     batch check): refused on every rank; the pipeline trains on after
--   - DataParallel and Zero over the world (or the pipeline group, or at
--     dp = 2 a group of one rank) of a pipeline model: refused on every
--     rank, naming mesh.dp
--   - validation loaders that run out at different batches on the ranks
--     (also one TP rank's under tp=2 x pp=2): refused on every rank; those
--     that run out together: one process's loss
--   - model:loss (evaluation) with another batch shape on one rank: refused
--   - a Llama with tied embeddings (the head on the last stage)
--   - bf16 and f16 models: one process's losses and norms to 1e-3; a model
--     turned from f32 to bf16 between steps (the link's agreed messages
--     were f32: the receivers waited for f32 buffers) trains on
--   - dropout: the stages drew the same masks (each rank's default
--     generator alike): now each draws its own, and the ranks' generators
--     agree after each step (also with 2 virtual stages a rank, and under
--     tp=2 x pp=2 with and without SP, where a stage's TP ranks draw alike)
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"

lt.dist.init()
lt.dist.set_timeout(60)
local world, rank = lt.dist.world_size(), lt.dist.rank()
local V, LR = 37, 1e-3
local mesh = lt.dist.mesh { pp = world }

-- a micro-batch of B x T ids and their next-token targets from generator g
local function mb(g, B, T)
  local x = lt.randint(0, V, { B, T + 1 }, { generator = g, dtype = "i64" })
  return x:narrow(2, 1, T):contiguous(), x:narrow(2, 2, T):contiguous()
end

-- trains model for #shapes steps of 2 micro-batches (step s of shapes[s] = {B, T}) from seed 3, with
-- AdamW over its parameters that require grad; freeze(model) first. Returns the losses and norms.
local function train(model, shapes, freeze)
  if freeze then freeze(model) end
  local ps = {}
  for _, p in ipairs(model:parameters()) do if p.requires_grad then ps[#ps + 1] = p end end
  local opt = lt.optim.AdamW(ps, { lr = LR, weight_decay = 0.1 })
  local S = lt.train.step.new { model = model, optimizer = opt, accum = 2, clip = 0.05 }
  local g = lt.Generator(3)
  local losses, norms = {}, {}
  for s, sh in ipairs(shapes) do
    local r = S:run(s, function() return mb(g, sh[1], sh[2]) end)
    losses[s], norms[s] = r.loss, r.grad_norm
  end
  return losses, norms, #ps
end

-- the stage's and the whole model's runs: losses, norms and this stage's weights (the last stage's
-- tied copy under the embedding's name); a frozen weight must not have moved
local function compare(cfg, shapes, freeze)
  local ref = P.gpt2(cfg)
  local start = {}
  for _, np in ipairs(ref:named_parameters()) do start[np[1]] = np[2]:clone() end
  local rl, rn = train(ref, shapes, freeze)
  local c = { pp = mesh.pp }
  for k, v in pairs(cfg) do c[k] = v end
  local model = P.gpt2(c)
  local l, n, trained = train(model, shapes, freeze)
  local fails = {}
  for s = 1, #shapes do
    if not (math.abs(l[s] - rl[s]) <= 1e-5 * rl[s] and math.abs(n[s] - rn[s]) <= 1e-5 * rn[s]) then
      fails[#fails + 1] = ("step %d: loss %.8f vs %.8f, norm %.6f vs %.6f"):format(s, l[s], rl[s], n[s], rn[s])
    end
  end
  local whole = {}
  for _, np in ipairs(ref:named_parameters()) do whole[np[1]] = np[2] end
  for _, np in ipairs(model:named_parameters()) do
    local name = np[1] == "lm_head.weight" and model.pp.copy and "transformer.wte.weight" or np[1]
    local d = (np[2]:to("f64") - whole[name]:to("f64")):abs():max():item()
    if not (d <= 1e-5) then fails[#fails + 1] = ("%s differs by %g"):format(name, d) end
    if not np[2].requires_grad and (np[2]:to("f64") - start[name]:to("f64")):abs():max():item() ~= 0 then
      fails[#fails + 1] = ("%s is frozen and moved"):format(name)
    end
  end
  return fails, trained
end

local function frozen(match)
  return function(m)
    for _, np in ipairs(m:named_parameters()) do if match(np[1]) then np[2].requires_grad = false end end
  end
end

H.test("a first stage with nothing to train (embedding and its blocks frozen, no parameter in its optimizer) "
  .. "trains as one process", function()
  -- the first stage holds blocks 0 .. 4/world - 1 (an even split of 4): every one of them frozen, and the embeddings
  local per = 4 / world
  local fails, trained = compare({ tie_embeddings = false }, { { 2, 8 }, { 2, 8 }, { 2, 8 } }, frozen(function(name)
    local b = tonumber(name:match("^transformer%.h%.(%d+)%."))
    return name:match("^transformer%.w[tp]e%.") or (b and b < per)
  end))
  if rank == 0 then assert(trained == 0, ("the first stage trains %d parameters"):format(trained)) end
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("a last stage with nothing to train (its blocks, final norm and untied head frozen) trains as one process",
  function()
  local per = 4 / world
  local fails, trained = compare({ tie_embeddings = false }, { { 2, 8 }, { 2, 8 } }, frozen(function(name)
    local b = tonumber(name:match("^transformer%.h%.(%d+)%."))
    return name:match("^transformer%.ln_f%.") or name:match("^lm_head%.") or (b and b >= 4 - per)
  end))
  if rank == world - 1 then assert(trained == 0, ("the last stage trains %d parameters"):format(trained)) end
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("a frozen block in the middle and a frozen position embedding (tied head) train as one process", function()
  local fails = compare({}, { { 2, 8 }, { 2, 8 } }, frozen(function(name)
    return name:match("^transformer%.h%.1%.") or name:match("^transformer%.wpe%.")
  end))
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("micro-batches whose B and T change between steps train as one process", function()
  local fails = compare({}, { { 2, 8 }, { 3, 8 }, { 2, 5 }, { 1, 1 }, { 2, 8 } })
  assert(#fails == 0, table.concat(fails, "; "))
end)

-- a pipeline model's step; step 1 on 2 x 8 micro-batches, then next(k) gives step 2's micro-batch k
local function stage_step(next2)
  local model = P.gpt2 { pp = mesh.pp }
  local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model:parameters(), { lr = LR }), accum = 2 }
  local g = lt.Generator(3)
  S:run(1, function() return mb(g, 2, 8) end)
  local k = 0
  local ok, err = pcall(S.run, S, 2, function()
    k = k + 1
    return next2(g, k)
  end)
  -- the pipeline trains on after the refusal (nothing was sent)
  local r = S:run(3, function() return mb(g, 2, 8) end)
  assert(r.loss > 0 and r.loss == r.loss, "the step after the refusal has no loss")
  return ok, err
end

H.test("a step whose micro-batches differ in shape is refused on every rank, naming the micro-batch", function()
  local ok, err = stage_step(function(g, k) return mb(g, 2, k == 1 and 8 or 6) end)
  assert(not ok, "a step of 2x8 and 2x6 micro-batches ran")
  for _, part in ipairs { "train: step 2", "one shape", "micro-batch 2 is 2x6 (ids), micro-batch 1's ids are 2x8" } do
    assert(tostring(err):find(part, 1, true), ("the message %q does not say %q"):format(tostring(err), part))
  end
end)

H.test("targets of another shape than their ids are refused on every rank", function()
  local ok, err = stage_step(function(g, k)
    local x, y = mb(g, 2, 8)
    if k == 2 and rank == world - 1 then y = y:narrow(2, 1, 7):contiguous() end
    return x, y
  end)
  assert(not ok, "targets of 2x7 ran")
  assert(tostring(err):find(("on pipeline rank %d micro-batch 2 is 2x7 (targets)"):format(world - 1), 1, true),
    tostring(err))
end)

H.test("a rank holding another batch shape than its neighbours (step 2) is refused on every rank", function()
  local ok, err = stage_step(function(g) return mb(g, rank == 1 and 3 or 2, 8) end)
  assert(not ok, "ranks of 2x8 and 3x8 micro-batches ran")
  for _, part in ipairs { "train: step 2", "different shapes (B 2 to 3, T 8 to 8", "read the same batches" } do
    assert(tostring(err):find(part, 1, true), ("the message %q does not say %q"):format(tostring(err), part))
  end
end)

H.test("DataParallel and Zero over the world or the pipeline group of a pipeline model are refused on every rank",
  function()
  local model = P.gpt2 { pp = mesh.pp }
  H.raises(function() lt.dist.DataParallel(model) end, "DataParallel: the model is split into " .. world
    .. " pipeline stages", "the group (the world)", "lt.dist.mesh{dp =, pp = " .. world .. "}.dp")
  H.raises(function() lt.dist.DataParallel(model, { group = mesh.pp }) end, "holds ranks of one pipeline group")
  H.raises(function() lt.dist.Zero(model, { stage = 1, lr = LR }) end, "Zero: the model is split into")
  -- mesh.dp (here a group of one rank) is the data-parallel group
  local ddp = lt.dist.DataParallel(model, { group = mesh.dp })
  assert(ddp.group == mesh.dp)
end)

if world == 4 then
  H.test("dp=2 x pp=2: DataParallel and Zero over the world or a group of one rank refused, over mesh.dp taken", function()
    local m2 = lt.dist.mesh { pp = 2 }
    local model = P.gpt2 { pp = m2.pp }
    H.raises(function() lt.dist.DataParallel(model) end, "split into 2 pipeline stages", "(4 ranks)")
    H.raises(function() lt.dist.DataParallel(model, { group = m2.pp }) end, "holds ranks of one pipeline group")
    -- (mesh.tp: a group of one rank at one stage; the two replicas would never be synchronised)
    H.raises(function() lt.dist.DataParallel(model, { group = m2.tp }) end, "the model's replicas span 2 ranks (tp x pp)"
      .. " of the job's 4, so its data-parallel group holds 2 ranks; the group holds 1 here")
    H.raises(function() lt.dist.Zero(model, { stage = 1, lr = LR, group = m2.tp }) end, "Zero: the model's replicas span 2")
    lt.dist.DataParallel(model, { group = m2.dp })
    lt.dist.Zero(model, { stage = 1, lr = LR, group = m2.dp })
  end)
end

-- n validation batches of 2 x 8 from seed 5
local function val(n)
  local g, out = lt.Generator(5), {}
  for i = 1, n do out[i] = { mb(g, 2, 8) } end
  return out
end

H.test("validation loaders that run out at different batches are refused on every rank; together: one "
  .. "process's loss", function()
  local model = P.gpt2 { pp = mesh.pp }
  H.raises(function() lt.train.evaluate(model, H.loader(val(rank == 1 and 2 or 3)), { batches = 5 }) end,
    "the pipeline ranks' validation loaders ran out at different batches (batch 3", "read the same batches")
  local got = lt.train.evaluate(model, H.loader(val(3)), { batches = 5 })
  local want = lt.train.evaluate(P.gpt2 {}, H.loader(val(3)), { batches = 5 })
  assert(math.abs(got - want) <= 1e-5 * want, ("validation loss %.8f, one process %.8f"):format(got, want))
end)

H.test("model:loss with another batch shape on one rank is refused on every rank", function()
  local model = P.gpt2 { pp = mesh.pp }
  local x, y = mb(lt.Generator(5), rank == world - 1 and 1 or 2, 8)
  H.raises(function() model:loss(x, y) end, "pipeline: loss: the pipeline's ranks hold micro-batches of different "
    .. "shapes (B 1 to 2, T 8 to 8")
  local x2, y2 = mb(lt.Generator(5), 2, 8)
  local got = model:loss(x2, y2):item()
  local want = P.gpt2 {}:loss(x2, y2):item()
  assert(math.abs(got - want) <= 1e-5 * want, ("loss %.8f, one process %.8f"):format(got, want))
end)

H.test("a Llama with tied embeddings trains as one process (the head's copy on the last stage)", function()
  local fails = P.compare { pp = world, family = "llama", config = { tie_embeddings = true } }
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("dropout: each stage draws masks of its own (not another stage's), the ranks' generators agree after "
  .. "each step, and a rerun repeats the losses", function()
  local random = require "lutra.random"
  local function run()
    local model = P.gpt2 { pp = mesh.pp, dropout = 0.2 }
    local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model:parameters(), { lr = LR }),
      accum = 2 }
    local g, rand, draws, losses = lt.Generator(3), random.rand, {}, {}
    lt.manual_seed(1)
    random.rand = function(shape, o)
      local t = rand(shape, o)
      draws[#draws + 1] = t:sum():item()
      return t
    end
    local ok, err = pcall(function()
      for s = 1, 2 do
        losses[s] = S:run(s, function() return mb(g, 2, 8) end).loss
        local st = lt.default_generator():state()
        local v = lt.tensor({ st.seed, st.offset, -st.seed, -st.offset }, { dtype = "f64" })
        lt.dist.all_reduce(v, { op = "max", group = mesh.pp })
        local m = v:totable()
        assert(m[1] == -m[3] and m[2] == -m[4] and st.offset > 0, ("step %d: rank %d's generator is %s, the "
          .. "pipeline's from (%d, %d) to (%d, %d)"):format(s, rank, tostring(lt.default_generator()), -m[3], -m[4],
          m[1], m[2]))
      end
    end)
    random.rand = rand
    if not ok then error(err, 0) end
    return draws, losses
  end
  local draws, losses = run()
  assert(#draws > 0, "no dropout mask drawn")
  -- the first mask of every rank against every other rank's masks of the step
  local all = lt.dist.all_gather(lt.tensor({ { draws[1], draws[2] } }, { dtype = "f64" })):totable()
  for r = 1, world do
    if r ~= rank + 1 then
      for _, d in ipairs(draws) do
        assert(d ~= all[r][1] and d ~= all[r][2], ("rank %d draws a mask of rank %d's (sum %.6f)"):format(rank, r - 1, d))
      end
    end
  end
  local _, again = run()
  for s = 1, 2 do assert(again[s] == losses[s], ("a rerun's step %d loss %.8f, first %.8f"):format(s, again[s], losses[s])) end
end)

-- the default generator's (seed, offset) the same on every rank of the job?
local function generators_agree(what)
  local st = lt.default_generator():state()
  local v = lt.tensor({ st.seed, st.offset, -st.seed, -st.offset }, { dtype = "f64" })
  lt.dist.all_reduce(v, { op = "max" })
  local m = v:totable()
  assert(m[1] == -m[3] and m[2] == -m[4], ("%s: rank %d's generator is %s, the job's from (%d, %d) to (%d, %d)")
    :format(what, rank, tostring(lt.default_generator()), -m[3], -m[4], m[1], m[2]))
end

H.test("dropout with 2 virtual stages a rank (interleaved): the generators agree after each step", function()
  local model = P.gpt2 { pp = mesh.pp, virtual_stages = 2, n_layer = 2 * world, dropout = 0.2 }
  local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model:parameters(), { lr = LR }),
    accum = world }
  local g = lt.Generator(3)
  lt.manual_seed(1)
  for s = 1, 2 do
    local r = S:run(s, function() return mb(g, 2, 8) end)
    assert(r.loss == r.loss and r.loss > 0, "no loss")
    generators_agree("step " .. s)
  end
end)

if world == 4 then
  H.test("tp=2 x pp=2 with dropout, with and without SP: the TP ranks draw alike (their replicated weights stay "
    .. "bitwise the same) and the generators agree", function()
    local m4 = lt.dist.mesh { tp = 2, pp = 2 }
    for _, sp in ipairs { false, true } do
      local model = P.gpt2 { pp = m4.pp, tp = m4.tp, sequence_parallel = sp, dropout = 0.2 }
      local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model:parameters(), { lr = 1e-2 }),
        accum = 2, ddp = lt.dist.DataParallel(model, { group = m4.dp }) }
      local g = lt.Generator(3)
      lt.manual_seed(1)
      for s = 1, 3 do S:run(s, function() return mb(g, 2, 8) end) end
      lt.dist.tp.check_replicated(model)
      generators_agree(sp and "SP" or "TP")
    end
  end)

  H.test("tp=2 x pp=2: one rank's micro-batches of another shape at step 2 refused on every rank (its TP partner "
    .. "and the other stage's too); the model trains on", function()
    local m4 = lt.dist.mesh { tp = 2, pp = 2 }
    local model = P.gpt2 { pp = m4.pp, tp = m4.tp }
    local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model:parameters(), { lr = LR }), accum = 2,
      ddp = lt.dist.DataParallel(model, { group = m4.dp }) }
    local g = lt.Generator(3)
    S:run(1, function() return mb(g, 2, 8) end)
    H.raises(function() S:run(2, function() return mb(g, rank == 1 and 3 or 2, 8) end) end, "train: step 2: ",
      "different shapes")
    local r = S:run(3, function() return mb(g, 2, 8) end)
    assert(r.loss > 0 and r.loss == r.loss, "the step after the refusal has no loss")
  end)

  H.test("tp=2 x pp=2: a validation loader that runs out early on one rank is refused on every rank", function()
    local m4 = lt.dist.mesh { tp = 2, pp = 2 }
    local model = P.gpt2 { pp = m4.pp, tp = m4.tp }
    -- rank 1: TP rank 1 of the first stage (its pipeline: ranks 1 and 3; its TP group: 0 and 1)
    H.raises(function() lt.train.evaluate(model, H.loader(val(rank == 1 and 1 or 2)), { batches = 3, own_loss = true })
    end, "ran out at different batches (batch 2", "read the same batches")
    local got = lt.train.evaluate(model, H.loader(val(2)), { batches = 3, own_loss = true })
    local want = lt.train.evaluate(P.gpt2 {}, H.loader(val(2)), { batches = 3 })
    assert(math.abs(got - want) <= 1e-5 * want, ("validation loss %.8f, one process %.8f"):format(got, want))
  end)
end

for _, dt in ipairs { "bf16", "f16" } do
  H.test(dt .. " weights and activations through the pipeline: one process's losses and norms (to 1e-3 relative: "
    .. "the tied gradient's two halves are summed in f32 then rounded, one process adds them in " .. dt .. ")", function()
    local function run(m)
      local S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m:parameters(), { lr = LR }), accum = 2,
        clip = 0.05 }
      local g, out = lt.Generator(3), {}
      for s = 1, 3 do
        local r = S:run(s, function() return mb(g, 2, 8) end)
        out[s] = { r.loss, r.grad_norm }
      end
      return out
    end
    local want = run(P.gpt2 { dtype = dt })
    local model = P.gpt2 { dtype = dt, pp = mesh.pp }
    for _, p in ipairs(model:parameters()) do assert(p.dtype == dt, "a stage parameter is " .. p.dtype) end
    local got = run(model)
    for s = 1, 3 do
      for i, what in ipairs { "loss", "norm" } do
        local a, b = got[s][i], want[s][i]
        assert(math.abs(a - b) <= 1e-3 * math.abs(b), ("step %d: %s %.8f, one process %.8f"):format(s, what, a, b))
      end
    end
  end)
end

H.test("a model turned to bf16 between steps (the link agreed f32 messages): the next steps are one process's", function()
  local function run(m)
    local g, out = lt.Generator(3), {}
    local S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m:parameters(), { lr = LR }), accum = 2 }
    out[1] = S:run(1, function() return mb(g, 2, 8) end).loss
    m:to("bf16")
    S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m:parameters(), { lr = LR }), accum = 2 }
    for s = 2, 3 do out[s] = S:run(s, function() return mb(g, 2, 8) end).loss end
    return out
  end
  local want, got = run(P.gpt2 {}), run(P.gpt2 { pp = mesh.pp })
  for s = 1, 3 do
    assert(math.abs(got[s] - want[s]) <= 1e-3 * want[s], ("step %d: loss %.8f, one process %.8f"):format(s, got[s],
      want[s]))
  end
end)

H.run("tests/dist/pp_break_spec.lua")
