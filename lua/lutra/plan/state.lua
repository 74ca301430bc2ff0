--- lutra.plan.state: the bytes of model state one rank holds under a
-- layout (parameters, gradients, optimizer state), counted as
-- lt.dist.memory_bytes counts them after an optimizer step of lt.train.
-- It lays the rank's parameters (lutra.plan.shapes) into ZeRO's flats with
-- ZeRO's own code (lutra.dist.flat.flat_groups, lt.dist.chunk), so the
-- counts are exact, not estimates; tests/lua/plan_spec.lua and
-- tests/dist/plan_spec.lua compare them with lt.dist.memory_bytes on real
-- layouts.
--
-- After lt.train's step (gradients are dropped at the start of the next):
--   AdamW (ZeRO 0)  every parameter, its gradient, exp_avg and exp_avg_sq
--                   in f32 (and an f32 master for bf16/f16 parameters)
--   ZeRO 1 and 2    every parameter, and per flat this rank's chunk
--                   (lt.dist.chunk: sizes differing by one at most) as a
--                   copy the inner AdamW updates, its gradient and AdamW's
--                   state for the chunk alone; the full gradients are gone
--                   (stage 1 drops them once its chunk is taken, stage 2
--                   reduce-scatters them away), so after the step the two
--                   stages hold the same (stage 1's full gradients and
--                   all-reduce buckets count at the peak: lutra.plan.memory)
--   ZeRO 3          no whole parameters: per unit (block) and flat a
--                   chunk of the flat padded to a multiple of dp, its
--                   gradient and its AdamW state
-- DataParallel's buckets (reported apart, as buffers): one flat buffer as
-- large as the trainable parameters, with gradients reduced by
-- all-reduce (ZeRO 0 and 1) on more than one data-parallel rank.
local flat = require "lutra.dist.flat"
local comm = require "lutra.dist.comm"
local pipeline = require "lutra.models.pipeline"
local shapes = require "lutra.plan.shapes"

local M = {}

--- state.round(bytes, device) -> the bytes lutra's caching allocator
-- hands out for a request (host/base/size-class.h: multiples of 64 bytes up
-- to 4 KiB on the CPU, of 512 up to 32 KiB on CUDA, then four classes per
-- power of two).
function M.round(n, device)
  local step, limit = 64, 4096
  if device == "cuda" then step, limit = 512, 32768 end
  if n <= 0 then return 0 end
  if n <= limit then return math.ceil(n / step) * step end
  local p = math.floor(math.log(n - 1) / math.log(2))
  while 2 ^ (p + 1) < n do p = p + 1 end
  while 2 ^ p >= n do p = p - 1 end
  local base, quarter = 2 ^ p, 2 ^ (p - 2)
  return base + math.ceil((n - base) / quarter) * quarter
end

local SIZE = { f32 = 4, bf16 = 2, f16 = 2, f64 = 8 }
M.dtype_bytes = SIZE

-- a parameter as flat_groups reads one
local Fake = {}
Fake.__index = Fake
function Fake:dim() return #self.shape end
function Fake:numel() return self.n end
function Fake:nbytes() return self.n * SIZE[self.dtype] end

--- state.stage_parameters(desc, layout, pp_rank) -> the parameters the
-- rank at pipeline coordinate pp_rank holds (shapes.parameters' entries
-- for its tensor-parallel shard), with copy = true on the last stage's
-- copy of a tied embedding; and the blocks it holds, in order.
function M.stage_parameters(d, L, s)
  local all = shapes.parameters(d, L.tp)
  if L.pp == 1 then return all end
  local S = L.pp * L.v
  local counts = pipeline.block_counts(d.n_layer, S, L.pp_stages)
  local mine, first = {}, 0
  for vs = 0, S - 1 do
    if vs % L.pp == s then for b = first, first + counts[vs + 1] - 1 do mine[b] = true end end
    first = first + counts[vs + 1]
  end
  local out = {}
  local has_first, has_last = s == 0, (S - 1) % L.pp == s
  for _, p in ipairs(all) do
    if (p.part == "embed" and has_first) or (p.part == "block" and mine[p.block])
        or ((p.part == "final" or p.part == "head") and has_last) then
      out[#out + 1] = p
    end
  end
  if d.tied and has_last and not has_first then -- the last stage's copy of the tied embedding
    local e = all[1]
    out[#out + 1] = { name = "lm_head.weight", shape = e.shape, numel = e.numel, sharded = e.sharded, copy = true,
      part = "head" }
  end
  return out
end

-- the fake parameters of a list, in dtype
local function fakes(list, dtype)
  local out, sharded, copies = {}, {}, {}
  for i, p in ipairs(list) do
    out[i] = setmetatable({ shape = p.shape, n = p.numel, dtype = dtype, requires_grad = true, device = "cpu" }, Fake)
    if p.sharded then sharded[out[i]] = true end
    if p.copy then copies[out[i]] = true end
  end
  return out, sharded, copies
end

--- state.bytes(desc, layout, coords) -> {params =, grads =, optimizer =,
-- buffers =, total = (params + grads + optimizer), numel = (this rank's
-- parameters), rounded = {params =, grads =, optimizer =, buffers =,
-- whole_grads =}: the same tensors as lutra's allocator hands them out
-- (state.round each; whole_grads: every parameter's gradient,
-- as backward makes them)} for the rank at coords {dp =, tp =, pp =}
-- (0-based; the default 0, 0, 0). layout: lutra.plan.layout's (dp, tp,
-- pp, v, zero, dtype, device). touched: the rounded fields unrounded (the
-- bytes written, what a resident set counts: lutra.plan.memory.estimate).
function M.bytes(d, L, coords, touched)
  coords = coords or {}
  local function R(n) return touched and n or M.round(n, L.device) end
  local list = M.stage_parameters(d, L, coords.pp or 0)
  local dt, B = L.dtype, SIZE[L.dtype]
  local master = (dt == "bf16" or dt == "f16") and 4 or 0 -- (f32 masters of 16-bit weights)
  local numel, each = 0, 0
  for _, p in ipairs(list) do numel, each = numel + p.numel, each + R(p.numel * B) end
  local r = { params = numel * B, grads = 0, optimizer = 0, buffers = 0, numel = numel }
  local q = { params = each, grads = 0, optimizer = 0, buffers = 0, whole_grads = each }
  r.rounded = q
  local moments = 8 + master -- exp_avg, exp_avg_sq in f32, and the master
  if L.zero == 0 then
    r.grads, r.optimizer = numel * B, numel * moments
    q.grads = each
    for _, p in ipairs(list) do q.optimizer = q.optimizer + 2 * R(p.numel * 4) + (master > 0 and R(p.numel * 4) or 0) end
  elseif L.zero == 1 or L.zero == 2 then
    local ps, sharded, copies = fakes(list, dt)
    local flats = flat.flat_groups(ps, 0.1, nil, L.tp > 1 and sharded or nil, L.pp > 1 and copies or nil)
    local mine = 0
    for _, f in ipairs(flats) do
      local _, len = comm.chunk(f.numel, L.dp, coords.dp or 0)
      mine = mine + len
      q.grads = q.grads + R(len * B)
      q.optimizer = q.optimizer + R(len * B) + 2 * R(len * 4) + (master > 0 and R(len * 4) or 0)
    end
    r.grads = mine * B
    r.optimizer = mine * (B + moments)
  else
    if L.pp > 1 then error("plan: ZeRO stage 3 with pipeline parallelism: lutra refuses the pair", 2) end
    -- units: each block, then the root (everything else), flats padded to a multiple of dp
    local units = {}
    for _, p in ipairs(list) do
      local u = p.block and p.block + 1 or 0
      units[u] = units[u] or {}
      table.insert(units[u], p)
    end
    local chunk = 0
    for u = 0, d.n_layer do
      if units[u] then
        local ps, sharded = fakes(units[u], dt)
        for _, f in ipairs(flat.flat_groups(ps, 0.1, L.dp, L.tp > 1 and sharded or nil)) do
          chunk = chunk + f.chunk
          q.params, q.grads = q.params + R(f.chunk * B), q.grads + R(f.chunk * B)
          q.optimizer = q.optimizer + 2 * R(f.chunk * 4) + (master > 0 and R(f.chunk * 4) or 0)
        end
      end
    end
    q.params = q.params - each -- (the whole parameters are dropped: only the chunks)
    r.params, r.grads, r.optimizer = chunk * B, chunk * B, chunk * moments
  end
  if L.dp > 1 and L.zero <= 1 then
    r.buffers = numel * B
    -- DataParallel's buckets: parameters in reverse order, up to 25 MiB each (lt.dist.DataParallel)
    local cur = 0
    for i = #list, 1, -1 do
      local b = list[i].numel * B
      if cur > 0 and cur + b > 25 * 2 ^ 20 then q.buffers, cur = q.buffers + R(cur), 0 end
      cur = cur + b
    end
    q.buffers = q.buffers + R(cur)
  end
  r.total = r.params + r.grads + r.optimizer
  return r
end

return M
