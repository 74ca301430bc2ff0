-- tests/gpu/checks/dist.lua: lt.dist on CUDA tensors with one rank (NCCL):
-- the collectives, DataParallel with ZeRO-1, and ZeRO-3 against plain
-- AdamW (dropped CUDA parameters free their memory).

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local CUDA = C.CUDA
local check = C.check

check("collectives on CUDA tensors go through NCCL (one rank): all_reduce, broadcast, all_gather, reduce_scatter", function()
  lt.dist.init()
  local x = lt.randn({ 1000 }, { generator = lt.Generator(3) })
  for _, dt in ipairs { "f32", "bf16" } do
    local g = x:to(CUDA, dt)
    lt.dist.all_reduce(g)
    lt.dist.all_reduce(g, { op = "avg" })
    lt.dist.broadcast(g, { src = 0 })
    local h = lt.dist.all_reduce(g, { async = true, op = "max" })
    h:wait()
    assert((g:to("cpu", "f32") - x:to(dt):to("f32")):abs():max():item() == 0, dt .. " changed by identity collectives")
  end
  local m = x:view(10, 100):to(CUDA)
  assert((lt.dist.all_gather(m):to("cpu") - x:view(10, 100)):abs():max():item() == 0, "all_gather")
  assert((lt.dist.reduce_scatter(m):to("cpu") - x:view(10, 100)):abs():max():item() == 0, "reduce_scatter")
end, true)

check("DataParallel and ZeRO-1 run on a CUDA model (one rank)", function()
  local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) }):to(CUDA)
  local ddp = lt.dist.DataParallel(model)
  local opt = lt.dist.Zero(model, { stage = 1, lr = 1e-3 })
  local ids = lt.randint(0, 512, { 2, 17 }, { generator = lt.Generator(2) }):to(CUDA)
  local x, y = ids:narrow(2, 1, 16):contiguous(), ids:narrow(2, 2, 16):contiguous()
  local first
  for step = 1, 5 do
    opt:zero_grad()
    local loss = model:loss(x, y)
    loss:backward()
    ddp:finish()
    opt:clip_grad_norm(1.0)
    opt:step()
    first = first or loss:item()
    if step == 5 then assert(loss:item() < first, "the loss did not fall") end
  end
end, true)

check("ZeRO-3 on a CUDA model (one rank, NCCL) matches plain AdamW; dropped CUDA parameters free their memory", function()
  local function make() return lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) }):to(CUDA) end
  local ref, model = make(), make()
  local ropt = lt.optim.AdamW(ref, { lr = 1e-3 })
  local param_bytes = 0
  for _, p in ipairs(model:parameters()) do param_bytes = param_bytes + p:nbytes() end
  collectgarbage()
  lt.cuda.synchronize()
  local before = lt.cuda.memory_stats().allocated
  local opt = lt.dist.Zero(model, { stage = 3, lr = 1e-3 }) -- (no collection: Zero frees its staging at once)
  lt.cuda.synchronize()
  assert(not model.transformer.wte.weight.has_data, "the parameters are dropped")
  -- one rank's shards hold every parameter again: the growth is the caching
  -- allocator's rounding of the shards to its size classes (512-byte steps,
  -- then four per power of two: 8% of the bytes for this model), well under
  -- a quarter; had the dropped parameters kept their memory it would be all
  -- of the model's bytes
  local grown = lt.cuda.memory_stats().allocated - before
  assert(grown < 0.25 * param_bytes, ("sharding on one rank grew allocated memory by %d bytes (parameters: %d)")
    :format(grown, param_bytes))
  local ids = lt.randint(0, 512, { 2, 17 }, { generator = lt.Generator(2) }):to(CUDA)
  local x, y = ids:narrow(2, 1, 16):contiguous(), ids:narrow(2, 2, 16):contiguous()
  for step = 1, 5 do
    ropt:zero_grad()
    local lr = ref:loss(x, y)
    lr:backward()
    lt.optim.clip_grad_norm(ref, 1.0)
    ropt:step()
    opt:zero_grad()
    local l = model:loss(x, y)
    l:backward()
    opt:reduce_gradients()
    opt:clip_grad_norm(1.0)
    opt:step()
    local a, b = l:item(), lr:item()
    assert(math.abs(a - b) <= 1e-5 * math.abs(b), ("step %d: ZeRO-3 loss %.7f, AdamW %.7f"):format(step, a, b))
  end
  opt:unshard()
  local d = (model.transformer.wte.weight:to("cpu") - ref.transformer.wte.weight:to("cpu")):abs():max():item()
  assert(d < 1e-5, ("the embeddings differ by %g after 5 steps"):format(d))
end, true)
