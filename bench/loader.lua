--- bench/loader.lua: tokens per second the shard loader delivers, shuffled,
-- from shards in the page cache, with its one prefetch thread (one core of
-- work). Uses data/pydocs (make data) or makes a synthetic shard.
--   ./lutra bench/loader.lua [--batch=16 --seq=1024 --seconds=3]
local lt = require "lutra"

local cfg = lt.config { path = "data/pydocs/train", batch = 16, seq = 1024, seconds = 3 }
local ok = pcall(lt.data.files, cfg.path)
local path = cfg.path
if not ok then
  path = os.tmpname()
  lt.data.write_shard(path, lt.randint(0, 50257, { 4000000 }, "i32"), 50257)
  print("(no shards at " .. cfg.path .. "; using 4M synthetic tokens)")
end
local L = lt.data.shards { path = path, batch = cfg.batch, seq = cfg.seq, seed = 1 }
for _ = 1, 10 do L:next() end -- warm up: page cache, allocator
local n, t0 = 0, lt.clock()
while lt.clock() - t0 < cfg.seconds do
  local x, y = L:next()
  x:free()
  y:free()
  n = n + 1
end
local secs = lt.clock() - t0
local tokens = n * cfg.batch * cfg.seq
print(("loader: %d batches of %dx%d in %.2f s: %.1f M tokens/s (target >= 50); %d windows, %d tokens in the shards")
  :format(n, cfg.batch, cfg.seq, secs, tokens / secs / 1e6, L:num_windows(), L:num_tokens()))
