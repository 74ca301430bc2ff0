-- tests/dist/plan_spec.lua: what the planner (lt.plan) knows of a layout's
-- ranks against the models lutra builds on them: the parameters of a
-- tensor-parallel rank (tp = 2) and of each pipeline stage (pp = the
-- ranks; interleaved, v = 2), name by name and shape by shape, for a
-- GPT-2 and a Llama with grouped-query heads. (The bytes and peaks of
-- whole training steps are checked by recipes/plan.lua --measure --check
-- in tests/dist/run.sh, each layout in a fresh job.)
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

lt.dist.init()
lt.dist.set_timeout(120)
local world = lt.dist.world_size()
local plan = lt.plan

local MODELS = {
  plan.shapes.describe("gpt2", { n_layer = 8, n_head = 4, n_embd = 64, block_size = 32, vocab_size = 1001 }, "gpt2"),
  plan.shapes.describe("llama", { dim = 96, n_layers = 8, n_heads = 4, n_kv_heads = 2, ffn_dim = 256,
    vocab_size = 2003, max_seq_len = 48 }, "llama"),
}

-- {name = "AxB"} of a model's parameters
local function shapes_of(model)
  local out, n = {}, 0
  for _, np in ipairs(model:named_parameters()) do
    out[np[1]] = table.concat(np[2]:shape(), "x")
    n = n + 1
  end
  return out, n
end

local function same(d, list, model, what)
  local want, n = shapes_of(model)
  for _, p in ipairs(list) do
    assert(want[p.name] == table.concat(p.shape, "x"), ("%s, %s: %s is %s to the planner, %s in the model"):format(
      d.name, what, p.name, table.concat(p.shape, "x"), tostring(want[p.name])))
  end
  assert(#list == n, ("%s, %s: the planner lists %d parameters, the model has %d"):format(d.name, what, #list, n))
end

local function build(d, o)
  local cfg = {}
  for k, v in pairs(d.config) do cfg[k] = v end
  for k, v in pairs(o) do cfg[k] = v end
  cfg.generator = lt.Generator(1)
  return lt.models[d.family](cfg)
end

H.test("a tensor-parallel rank's parameters are the model's, name by name (tp = 2)", function()
  local mesh = lt.dist.mesh { tp = 2 }
  for _, d in ipairs(MODELS) do same(d, plan.shapes.parameters(d, 2), build(d, { tp = mesh.tp }), "tp 2") end
end)

H.test("each pipeline stage's parameters are the stage model's (pp = the ranks, 1F1B and v = 2)", function()
  local mesh = lt.dist.mesh { pp = world }
  for _, d in ipairs(MODELS) do
    for _, v in ipairs { 1, 2 } do
      local L = plan.layout { pp = world, v = v, micro_batches = world, device = "cpu", dtype = "f32" }
      local model = build(d, { pp = mesh.pp, virtual_stages = v > 1 and v or nil })
      same(d, plan.state.stage_parameters(d, L, mesh.coords.pp), model, ("pp %d v %d stage %d"):format(world, v,
        mesh.coords.pp))
    end
  end
end)

H.test("DataParallel with ZeRO 1: the planner's bytes are lt.dist.memory_bytes' after a step", function()
  local d = MODELS[1]
  local model = build(d, {})
  local ddp = lt.dist.DataParallel(model)
  local opt = lt.dist.Zero(model, { stage = 1, lr = 1e-3 })
  local x = lt.randint(0, d.vocab_size, { 2, 9 }, { generator = lt.Generator(lt.dist.rank()), dtype = "i64" })
  local S = lt.train.step.new { model = model, optimizer = opt, ddp = ddp }
  S:run(1, function() return x:narrow(2, 1, 8):contiguous(), x:narrow(2, 2, 8):contiguous() end)
  local got = lt.dist.memory_bytes(model, opt, ddp)
  local want = plan.state.bytes(d, plan.layout { dp = world, zero = 1, device = "cpu", dtype = "f32" },
    { dp = lt.dist.rank() })
  for _, k in ipairs { "params", "grads", "optimizer", "buffers" } do
    assert(got[k] == want[k], ("%s: lt.dist.memory_bytes %d, the planner %d"):format(k, got[k], want[k]))
  end
end)

H.run("plan_spec")
