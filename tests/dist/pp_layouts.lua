-- tests/dist/pp_layouts.lua: the pipeline specs' shared part
-- (tests/dist/pp_spec.lua, tests/dist/jobs/pp_3d.lua): a tiny GPT-2 or
-- Llama, whole or split over a mesh, trained by lt.train.step on the same
-- global batches, and P.compare(layout), which trains the layout on the
-- job and the whole model in this process and lists what differs.
local lt = require "lutra"

local P = {}

local V, B, T, M, STEPS = 37, 2, 8, 4, 10
local LR, WD, CLIP = 1e-3, 0.1, 0.05 -- (the clip fires at every step: the norms are above it)

--- P.gpt2(overrides) / P.llama(overrides): the tiny models (4 blocks), their weights from seed 7.
function P.gpt2(o)
  local c = { n_layer = 4, n_head = 2, n_embd = 16, block_size = 8, vocab_size = V }
  for k, v in pairs(o or {}) do c[k] = v end
  c.generator = lt.Generator(7)
  return lt.models.gpt2(c)
end

function P.llama(o)
  local c = { dim = 16, n_layers = 4, n_heads = 2, n_kv_heads = 2, vocab_size = V, ffn_dim = 32, max_seq_len = 8 }
  for k, v in pairs(o or {}) do c[k] = v end
  c.generator = lt.Generator(7)
  return lt.models.llama(c)
end

-- the global micro-batches: STEPS * M of dp * B rows
local function batches(dp)
  local g = lt.Generator(11)
  local out = {}
  for i = 1, STEPS * M do
    local x = lt.randint(0, V, { dp * B, T + 1 }, { generator = g, dtype = "i64" })
    out[i] = { x:narrow(2, 1, T):contiguous(), x:narrow(2, 2, T):contiguous() }
  end
  return out
end

-- trains model for STEPS steps on the micro-batches' rows [first, first + count)
local function train(model, data, first, count, o)
  local opt, ddp
  if o.zero then
    opt = lt.dist.Zero(model, { stage = o.zero, optimizer = "AdamW", lr = LR, weight_decay = WD, group = o.dp_group })
  else
    opt = lt.optim.AdamW(model:parameters(), { lr = LR, weight_decay = WD })
  end
  if o.dp_group then
    ddp = lt.dist.DataParallel(model, { group = o.dp_group, gradients = o.zero == 2 and "none" or "all_reduce" })
  end
  local S = lt.train.step.new { model = model, optimizer = opt, accum = M, clip = CLIP, ddp = ddp,
    pp_schedule = o.schedule }
  local i, losses, norms = 0, {}, {}
  for s = 1, STEPS do
    local r = S:run(s, function()
      i = i + 1
      return data[i][1]:narrow(1, first, count):contiguous(), data[i][2]:narrow(1, first, count):contiguous()
    end)
    losses[s], norms[s] = r.loss, r.grad_norm
  end
  return losses, norms
end

-- the stage's weights by the whole model's names (TP shards gathered; the
-- last stage's tied head under the embedding's name)
local function whole_weights(model, family)
  local sd = model.tp_group and lt.dist.tp.full_state_dict(model) or {}
  if not model.tp_group then
    for _, np in ipairs(model:named_parameters()) do sd[np[1]] = np[2] end
  end
  local tied = family == "llama" and "model.embed_tokens.weight" or "transformer.wte.weight"
  if lt.models.pipeline.copy(model) and sd["lm_head.weight"] then
    sd[tied], sd["lm_head.weight"] = sd["lm_head.weight"], nil
  end
  for name, t in pairs(sd) do -- (a vocabulary padded for TP: the rows past V, zero, are not the model's)
    if (name == tied or name == "lm_head.weight") and t:size(1) > V then sd[name] = t:narrow(1, 1, V) end
  end
  return sd
end

--- P.compare(layout) -> {failure messages}: layout = {pp =, tp = 1, sp =,
-- v = 1, schedule =, zero = (1 or 2; none: AdamW), family = "gpt2" |
-- "llama", stages = (blocks per virtual stage), config = (the model's
-- settings over P.gpt2's / P.llama's, for both models)}; dp is what the job's
-- ranks leave. Trains the layout and the whole model (on this rank) and
-- compares every step's loss and norm and every weight of this stage;
-- the tied copies bitwise between the first and last stage. Every rank
-- calls it; the failures are this rank's.
function P.compare(L)
  local world = lt.dist.world_size()
  local tp, pp = L.tp or 1, L.pp
  local dp = world / (tp * pp)
  local mesh = lt.dist.mesh { tp = tp, pp = pp }
  local build = L.family == "llama" and P.llama or P.gpt2
  local data = batches(dp)
  local function with(o)
    for k, v in pairs(L.config or {}) do o[k] = v end
    return o
  end
  local ref = build(with {})
  local ref_loss, ref_norm = train(ref, data, 1, dp * B, {})
  local model = build(with { pp = mesh.pp, virtual_stages = L.v, pp_stages = L.stages,
    tp = tp > 1 and mesh.tp or nil, sequence_parallel = L.sp })
  local loss, norm = train(model, data, mesh.coords.dp * B + 1, B,
    { zero = L.zero, schedule = L.schedule, dp_group = (dp > 1 or tp > 1) and mesh.dp or nil })
  local fails = {}
  if os.getenv("PP_DEBUG") then
    for s = 1, STEPS do print(("step %d loss %.3g norm %.3g"):format(s, math.abs(loss[s] - ref_loss[s]) / ref_loss[s], math.abs(norm[s] - ref_norm[s]) / ref_norm[s])) end
  end
  for s = 1, STEPS do
    local dl = math.abs(loss[s] - ref_loss[s]) / math.abs(ref_loss[s])
    local dn = math.abs(norm[s] - ref_norm[s]) / ref_norm[s]
    if not (dl <= 1e-5 and dn <= 1e-5) then
      fails[#fails + 1] = ("step %d: loss %.8f vs %.8f, norm %.6f vs %.6f"):format(s, loss[s], ref_loss[s], norm[s],
        ref_norm[s])
    end
    if not (ref_norm[s] > CLIP) then fails[#fails + 1] = ("step %d: the clip did not fire (norm %g)"):format(s, ref_norm[s]) end
  end
  local whole = {}
  for _, np in ipairs(ref:named_parameters()) do whole[np[1]] = np[2] end
  local mine, n = whole_weights(model, L.family), 0
  for name, t in pairs(mine) do
    n = n + 1
    local r = whole[name]
    if not r then
      fails[#fails + 1] = "no parameter " .. name .. " in the whole model"
    else
      local d = (t:to("f64") - r:to("f64")):abs():max():item()
      if not (d <= 1e-5) then fails[#fails + 1] = ("%s differs by %g"):format(name, d) end
    end
  end
  if n == 0 then fails[#fails + 1] = "the stage holds no parameters" end
  local P_ = model.pp
  if P_.tied_group then -- the tied copies: bitwise the same on the first and last stage
    local w = lt.models.pipeline.tied(model):detach():contiguous():to("f64")
    local hi, lo = w:clone(), w:neg()
    lt.dist.all_reduce(hi, { op = "max", group = P_.tied_group })
    lt.dist.all_reduce(lo, { op = "max", group = P_.tied_group })
    if (hi - w):abs():max():item() ~= 0 or (lo:neg() - w):abs():max():item() ~= 0 then
      fails[#fails + 1] = "the tied embedding's copies on the first and last stage differ"
    end
  end
  return fails
end

return P
