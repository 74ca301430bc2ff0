-- tests/dist/loader_spec.lua: the data loader under mpirun, each rank taking
-- its rank and world from lt.dist: on shards whose windows do not divide by
-- the ranks, every rank is in the same epoch after every step, the ranks'
-- batches of a step are disjoint, and no window is read twice in an epoch
-- (the remainder is dropped). run.sh runs it on 2, 3 and 4 ranks.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

local ROOT
local function root()
  if ROOT then return ROOT end
  ROOT = H.shared_dir("lutra-dist-loader")
  if lt.dist.rank() == 0 then
    os.execute("mkdir -p " .. ROOT)
    -- shards of consecutive ids (a window's first token / T names it): 5 and 6 windows of T = 4, 11 in all
    lt.data.write_shard(ROOT .. "/train_000.bin", lt.arange(0, 21, "i32"), 512)
    lt.data.write_shard(ROOT .. "/train_001.bin", lt.arange(21, 46, "i32"), 512)
  end
  lt.dist.barrier()
  return ROOT
end

local T = 4

for _, shuffle in ipairs { true, false } do
  H.test(("ranks stay in step on 11 windows (shuffle %s): same epoch, disjoint batches, each window once an epoch")
    :format(tostring(shuffle)), function(r, w)
    local B = 2
    local L = lt.data.shards { path = root(), batch = B, seq = T, seed = 4, shuffle = shuffle }
    assert(L.rank == r and L.world == w, "the loader takes lt.dist's rank and world")
    local per = L:windows_per_epoch()
    local seen, read = {}, 0
    for step = 1, 12 do
      local x = L:next()
      -- this rank's epoch after the step and its rows' windows, gathered from every rank
      local mine = { L:state().epoch }
      for _, row in ipairs(x:totable()) do mine[#mine + 1] = row[1] end
      local all = lt.dist.all_gather(lt.tensor({ mine }, { dtype = "i64" })):totable()
      for q = 1, w do
        assert(all[q][1] == all[1][1], ("after step %d rank 0 is in epoch %d, rank %d in %d"):format(step,
          all[1][1], q - 1, all[q][1]))
        for k = 1, B do
          local pos = (step - 1) * B + k - 1 -- this row's place in rank q-1's stream
          local e, win = math.floor(pos / per), all[q][k + 1]
          seen[e] = seen[e] or {}
          assert(not seen[e][win], ("window starting at token %d read twice in epoch %d (step %d, rank %d)")
            :format(win, e, step, q - 1))
          seen[e][win] = true
          read = read + 1
        end
      end
    end
    local n = L:num_windows()
    assert(per * w <= n and n - per * w < w, ("%d windows per epoch on each of %d ranks, of %d"):format(per, w, n))
    assert(read == 12 * B * w)
  end)
end

H.run("loader_spec")
if lt.dist.rank() == 0 and ROOT then os.execute("rm -rf " .. ROOT) end
