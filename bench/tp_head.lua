-- bench/tp_head.lua: the time and peak extra CPU memory of
-- lt.dist.tp.linear_cross_entropy (the vocabulary-parallel head and loss)
-- against F.linear_cross_entropy, forward + backward, f32.
--   mpirun -np 1 ./lutra bench/tp_head.lua --impl=F       (one process, the whole V)
--   mpirun -np 1 ./lutra bench/tp_head.lua --impl=tp      (tp=1: F itself)
--   mpirun -np 2 ./lutra bench/tp_head.lua --impl=tp      (tp=2: V/2 columns a rank)
--   mpirun -np 1 ./lutra bench/tp_head.lua --impl=F --V=25152   (one rank's share, fused in C)
-- --threads=T sets each process's CPU threads (tp=2 on a 2-core machine: 1).
-- Run each in a fresh process: the peak is the allocator's since the start,
-- so peak - (allocated before the first step) is the step's extra memory.
local lt = require "lutra"
local args = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-(%w+)=(.*)$")
  if k then args[k] = v end
end
local N, C, V = tonumber(args.N or 512), tonumber(args.C or 128), tonumber(args.V or 50304)
local impl, iters = args.impl or "tp", tonumber(args.iters or 5)
if args.threads then lt.set_num_threads(tonumber(args.threads)) end -- (--threads=1: one core a rank)
local rank, world = lt.dist.init()
local g = lt.dist.new_group(0, rank)
local gen = lt.Generator(1)
local W = impl == "tp" and V / world or V
local y = lt.randn({ N, C }, { generator = gen }):requires_grad_()
local w = lt.no_grad(function() -- (this rank's rows of the whole head)
  return (lt.randn({ V, C }, { generator = gen }) * 0.02):narrow(1, rank * W + 1, W):contiguous()
end):requires_grad_()
local t = lt.randint(0, V, { N }, { generator = gen })
local function step()
  y.grad, w.grad = nil, nil
  local loss
  if impl == "tp" then
    loss = lt.dist.tp.linear_cross_entropy(lt.dist.tp.copy_to_region(y, g), w, t, g, { count = false })
  else
    loss = lt.F.linear_cross_entropy(y, w, t, { count = false })
  end
  loss:backward()
  return loss
end
collectgarbage()
local before = lt.memory_stats().allocated
local loss = step()
local extra = lt.memory_stats().peak - before
lt.dist.barrier()
local start = lt.clock()
for _ = 1, iters do loss = step() end
lt.dist.barrier()
local ms = (lt.clock() - start) * 1000 / iters
if rank == 0 then
  print(("%s tp=%d threads=%d N=%d C=%d V=%d (%d columns a rank): loss %.6f, %.1f ms a step (fwd+bwd), "
    .. "peak extra %.1f MiB (one (N, V/n) f32 buffer: %.1f MiB)")
    :format(impl, world, lt.get_num_threads(), N, C, V, W, loss:item(), ms, extra / 2^20, N * W * 4 / 2^20))
end
