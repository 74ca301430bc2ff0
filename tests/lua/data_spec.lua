-- tests/lua/data_spec.lua: token shards and the loader: windows and their
-- (x, y) shift, each window exactly once per epoch, shuffling by (seed,
-- epoch), disjoint rank streams that cover an epoch, ranks kept in step
-- when the windows do not divide by them, exact resume mid-epoch
-- and in a later epoch, the unshuffled validation order, and bad shards
-- rejected naming the file and the problem. Also recipes/prepare.lua and lt.config.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d)
  return d
end

--- Shards of consecutive ids, so a window's first token tells which it is.
local function make_shards(dir, sizes)
  local at = 0
  for i, n in ipairs(sizes) do
    lt.data.write_shard(("%s/train_%03d.bin"):format(dir, i), lt.arange(at, at + n, "i32"), 50257)
    at = at + n
  end
end

local function window_ids(x, T)
  local ids = {}
  for _, row in ipairs(x:totable()) do ids[#ids + 1] = row[1] end
  return ids
end

describe("shards and the loader", function()
  local dir = tmpdir()
  make_shards(dir, { 101, 121, 30 }) -- T = 10: 10 + 12 + 2 windows
  local T = 10

  it("cuts windows of T+1 tokens with y shifted by one", function()
    local L = lt.data.shards { path = dir, batch = 2, seq = T, shuffle = false }
    assert.are.equal(24, L:num_windows())
    assert.are.equal(252, L:num_tokens())
    assert.are.equal(12, L:batches_per_epoch())
    local x, y = L:next()
    assert.are.same({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, x:totable()[1])
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, y:totable()[1])
    assert.are.same({ 10, 11, 12, 13, 14, 15, 16, 17, 18, 19 }, x:totable()[2])
    assert.are.equal("i32", x.dtype)
  end)
  it("visits every window exactly once per epoch, reshuffled each epoch", function()
    local L = lt.data.shards { path = dir, batch = 4, seq = T, seed = 3 }
    local orders = {}
    for epoch = 1, 2 do
      local seen, order = {}, {}
      for _ = 1, 6 do
        for _, w in ipairs(window_ids(L:next(), T)) do
          assert.is_nil(seen[w], "window seen twice in an epoch")
          seen[w] = true
          order[#order + 1] = w
        end
      end
      local n = 0
      for _ in pairs(seen) do n = n + 1 end
      assert.are.equal(24, n)
      orders[epoch] = order
    end
    assert.are_not.same(orders[1], orders[2])
    local again = lt.data.shards { path = dir, batch = 4, seq = T, seed = 3 }
    local first = {}
    for _ = 1, 6 do
      for _, w in ipairs(window_ids(again:next(), T)) do first[#first + 1] = w end
    end
    assert.are.same(orders[1], first) -- the same seed gives the same order
  end)
  it("gives ranks disjoint streams that together cover the epoch", function()
    local seen = {}
    for rank = 0, 2 do
      local L = lt.data.shards { path = dir, batch = 2, seq = T, seed = 5, rank = rank, world = 3 }
      assert.are.equal(4, L:batches_per_epoch())
      for _ = 1, 4 do
        for _, w in ipairs(window_ids(L:next(), T)) do
          assert.is_nil(seen[w], "two ranks share window " .. w)
          seen[w] = true
        end
      end
    end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.are.equal(24, n)
  end)
  it("keeps data-parallel ranks in step when the windows do not divide by the ranks", function()
    -- every rank r of world, stepped together: at each step all ranks are in
    -- the same epoch, no window is read twice in an epoch (by any rank), each
    -- complete epoch reads the same number of windows on every rank, and the
    -- ranks' rows are one process's order, each epoch's remainder dropped:
    -- row i of an epoch on rank r is that epoch's window i * world + r
    for _, nwin in ipairs { 6, 7, 11 } do
      local d = tmpdir()
      make_shards(d, { nwin * T + 1 })
      for _, world in ipairs { 2, 3, 4 } do
        for _, B in ipairs { 1, 2, 3 } do
          for _, shuffle in ipairs { true, false } do
            local what = ("%d windows, %d ranks, batch %d, shuffle %s"):format(nwin, world, B, tostring(shuffle))
            local loaders, per = {}, {}
            for r = 0, world - 1 do
              loaders[r] = lt.data.shards { path = d, batch = B, seq = T, seed = 2, rank = r, world = world,
                shuffle = shuffle, prefetch = 1 }
            end
            -- one process's order over enough epochs, by epoch
            local single = lt.data.shards { path = d, batch = 1, seq = T, seed = 2, shuffle = shuffle, prefetch = 1 }
            local order = {}
            for e = 0, math.ceil(3 * nwin * B / loaders[0]:windows_per_epoch()) do
              order[e] = {}
              for i = 1, nwin do order[e][i] = window_ids(single:next(), T)[1] end
            end
            single:close()
            local seen, counts = {}, {} -- seen[epoch][window], counts[epoch][rank]
            for step = 1, 3 * nwin do
              local epoch
              for r = 0, world - 1 do
                local L = loaders[r]
                for _, w in ipairs(window_ids(L:next(), T)) do
                  -- the epoch of each row follows from the rank's position: rows are read in stream order
                  per[r] = (per[r] or 0) + 1
                  local pos = per[r] - 1
                  local e = math.floor(pos / L:windows_per_epoch())
                  local i = pos % L:windows_per_epoch()
                  local want = order[e][i * world + r + 1]
                  assert(w == want, ("%s: rank %d's row %d of epoch %d is window %d, one process's window %d there "
                    .. "is %d"):format(what, r, i, e, w, i * world + r, want))
                  seen[e] = seen[e] or {}
                  assert(not seen[e][w], ("%s: window %d read twice in epoch %d"):format(what, w, e))
                  seen[e][w] = true
                  counts[e] = counts[e] or {}
                  counts[e][r] = (counts[e][r] or 0) + 1
                end
                local e = L:state().epoch
                if r == 0 then epoch = e end
                assert(e == epoch, ("%s: after step %d rank 0 is in epoch %d, rank %d in %d"):format(what, step,
                  epoch, r, e))
              end
            end
            -- the epochs the ranks completed read floor(nwin / world) windows each, the rest dropped
            local done = math.floor(3 * nwin * B / loaders[0]:windows_per_epoch())
            for e = 0, done - 1 do
              local total = 0
              for r = 0, world - 1 do
                assert(counts[e][r] == counts[e][0], ("%s: in epoch %d rank 0 reads %d windows, rank %d %d")
                  :format(what, e, counts[e][0], r, tostring(counts[e][r])))
                total = total + counts[e][r]
              end
              assert(total <= nwin and nwin - total < world, ("%s: epoch %d reads %d of %d windows"):format(what, e,
                total, nwin))
            end
            for r = 0, world - 1 do loaders[r]:close() end
          end
        end
      end
    end
  end)
  it("resumes a rank of several exactly when the windows do not divide by the ranks", function()
    -- 24 windows on 5 ranks: 4 per epoch each, 4 dropped; batch 3 crosses epochs
    local function open() return lt.data.shards { path = dir, batch = 3, seq = T, seed = 7, rank = 3, world = 5 } end
    local full, reference = open(), {}
    for k = 1, 9 do reference[k] = full:next():totable() end
    for _, cut in ipairs { 1, 4, 7 } do
      local a = open()
      for _ = 1, cut do a:next() end
      local state = lt.json.decode(lt.json.encode(a:state()))
      a:close()
      local b = open()
      b:load_state(state)
      for k = cut + 1, 9 do assert.are.same(reference[k], b:next():totable(), "batch " .. k .. " after " .. cut) end
    end
  end)
  it("resumes exactly, mid-epoch and in a later epoch", function()
    local full = lt.data.shards { path = dir, batch = 5, seq = T, seed = 9 }
    local reference = {}
    for k = 1, 14 do reference[k] = full:next():totable() end -- about three epochs
    for _, cut in ipairs { 1, 3, 5, 9, 13 } do
      local a = lt.data.shards { path = dir, batch = 5, seq = T, seed = 9 }
      for _ = 1, cut do a:next() end
      local state = lt.json.decode(lt.json.encode(a:state())) -- as a checkpoint keeps it
      a:close()
      local b = lt.data.shards { path = dir, batch = 5, seq = T, seed = 9 }
      b:load_state(state)
      for k = cut + 1, 14 do assert.are.same(reference[k], b:next():totable(), "batch " .. k .. " after " .. cut) end
    end
    local c = lt.data.shards { path = dir, batch = 5, seq = T, seed = 10 }
    H.assert_error(function() c:load_state(full:state()) end, "seed")
    H.assert_error(function() full:load_state { epoch = 0, index = 1e9 } end, "outside")
  end)
  it("reads validation data in order and ends", function()
    local V = lt.data.shards { path = dir, batch = 4, seq = T, shuffle = false, epochs = 1 }
    local all = {}
    for x in V:batches() do
      for _, w in ipairs(window_ids(x, T)) do all[#all + 1] = w end
    end
    assert.are.equal(24, #all)
    for k = 2, #all do assert.is_true(all[k] > all[k - 1]) end
    assert.is_nil(V:next())
  end)
  it("rejects bad shards naming the file and the problem", function()
    local d = tmpdir()
    local function put(name, bytes)
      local f = assert(io.open(d .. "/" .. name, "wb"))
      f:write(bytes)
      f:close()
      return d .. "/" .. name
    end
    local function header(magic, version, count)
      local function i32(v)
        v = v % 2 ^ 32
        return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256, math.floor(v / 16777216) % 256)
      end
      return i32(magic) .. i32(version) .. i32(count) .. string.rep("\0", 1012)
    end
    local cases = {
      { "short.bin", "abc", "shorter than" },
      { "magic.bin", header(123, 1, 0), "magic 123" },
      { "version.bin", header(20240520, 7, 0), "version 7" },
      { "count.bin", header(20240520, 1, 10) .. string.rep("\0", 8), "counts 10 tokens", "truncated" },
      { "long.bin", header(20240520, 1, 1) .. string.rep("\0", 8), "counts 1 tokens" },
      { "negative.bin", header(20240520, 1, -5), "negative" },
      { "tiny.bin", header(20240520, 1, 3) .. "\1\0\2\0\3\0", "fewer than" },
    }
    for _, c in ipairs(cases) do
      local p = put(c[1], c[2])
      H.assert_error(function() lt.data.shards { path = p, batch = 1, seq = T } end, unpack(c, 3))
    end
    H.assert_error(function() lt.data.shards { path = d .. "/nothing", batch = 1, seq = 4 } end, "no shard files")
    H.assert_error(function() lt.data.shards { path = dir, batch = 0, seq = 4 } end, "batch 0")
    H.assert_error(function() lt.data.write_shard(d .. "/x.bin", { 1, 70000 }, 50257) end, "token 70000", "position 2")
    os.execute("rm -rf " .. d)
  end)
  it("a shard cut short while the loader reads it is an error naming it (not a SIGBUS)", function()
    local d = tmpdir()
    make_shards(d, { 5001 })
    local L = lt.data.shards { path = d, batch = 2, seq = 10, shuffle = false }
    L:next()
    os.execute(("truncate -s 2048 %s/train_001.bin"):format(d))
    local ok, err
    for _ = 1, 300 do -- past the batches already prefetched
      ok, err = pcall(L.next, L)
      if not ok then break end
    end
    assert(not ok, "the loader went on reading a truncated shard")
    assert(tostring(err):find("train_001.bin", 1, true) and tostring(err):find("changed under the loader", 1, true),
      tostring(err))
  end)

  it("writes u32 shards for large vocabularies", function()
    local d = tmpdir()
    lt.data.write_shard(d .. "/big.bin", lt.tensor({ 1, 100000, 128255 }, "i32"), 128256)
    local f = assert(io.open(d .. "/big.bin", "rb"))
    local bytes = f:read("*a")
    f:close()
    assert.are.equal(1024 + 12, #bytes)
    local L = lt.data.shards { path = d .. "/big.bin", batch = 1, seq = 2, shuffle = false }
    assert.are.same({ { 1, 100000 } }, (L:next()):totable())
    os.execute("rm -rf " .. d)
  end)
end)

describe("recipes/prepare.lua", function()
  it("turns documents into train and val shards, deterministically", function()
    local d = tmpdir()
    local jl = assert(io.open(d .. "/docs.jsonl", "w"))
    for i = 1, 20 do jl:write(lt.json.encode { body = ("document %d says hello"):format(i) }, "\n") end
    jl:close()
    local cmd = ("./lutra recipes/prepare.lua --input=%s/docs.jsonl --field=body --out=%s/%s --val_frac=0.25 --quiet")
    assert.is_true(os.execute(cmd:format(d, d, "a")) == 0)
    assert.is_true(os.execute(cmd:format(d, d, "b")) == 0)
    assert.is_true(os.execute(("cmp -s %s/a/train_000000.bin %s/b/train_000000.bin"):format(d, d)) == 0)
    local tok = lt.tokenizer.load()
    local val = lt.data.shards { path = d .. "/a/val", batch = 1, seq = 1, shuffle = false, epochs = 1 }
    local ids = {}
    for x, y in val:batches() do ids[#ids + 1] = x:item() end
    local text = tok:decode(ids)
    assert.truthy(text:find("document 1 says hello<|endoftext|>document 5 says hello", 1, true), text)
    os.execute("mkdir -p " .. d .. "/texts")
    local good = assert(io.open(d .. "/texts/a.txt", "wb"))
    good:write("fine\n")
    good:close()
    local bad = assert(io.open(d .. "/texts/bad.txt", "wb"))
    bad:write("fine\n\255 not utf8\n")
    bad:close()
    local p = io.popen(("./lutra recipes/prepare.lua --input=%s/texts --out=%s/c --quiet 2>&1"):format(d, d))
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("bad.txt", 1, true) and out:find("invalid UTF-8 at byte 6", 1, true), out)
    local blank = assert(io.open(d .. "/blank.jsonl", "w")) -- (it printed a 0/0 progress bar)
    blank:write("\n  \n")
    blank:close()
    p = io.popen(("./lutra recipes/prepare.lua --input=%s/blank.jsonl --out=%s/e --quiet 2>&1"):format(d, d))
    out = p:read("*a")
    p:close()
    assert.truthy(out:find("blank.jsonl holds no documents (2 lines, none with text)", 1, true), out)
    os.execute("rm -rf " .. d)
  end)
  local function run(cmd)
    local p = io.popen(cmd .. " 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    return out, tonumber(out:match("rc=(%d+)%s*$"))
  end
  local function listing(dir)
    local p = io.popen("LC_ALL=C ls -A " .. dir)
    local names = {}
    for name in p:lines() do names[#names + 1] = name end
    p:close()
    return names
  end
  it("refuses a non-empty --out unless --overwrite, which replaces the old shards (none left to mix in)", function()
    local d = tmpdir()
    local function docs(name, n)
      local f = assert(io.open(d .. "/" .. name, "w"))
      for i = 1, n do f:write(lt.json.encode { text = ("%s document %d"):format(name, i) }, "\n") end
      f:close()
    end
    docs("big.jsonl", 40)
    docs("small.jsonl", 4)
    local cmd = "./lutra recipes/prepare.lua --input=%s/%s --out=%s/%s --shard_size=20 --val_frac=0.5 --quiet %s"
    local out, rc = run(cmd:format(d, "big.jsonl", d, "out", ""))
    assert.are.equal(0, rc, out)
    local before = #listing(d .. "/out")
    assert.is_true(before > 4, out) -- several train and val shards
    out, rc = run(cmd:format(d, "small.jsonl", d, "out", ""))
    assert.are_not.equal(0, rc)
    assert.truthy(out:find("--out=" .. d .. "/out is not empty (" .. before .. " entries: train_000000.bin", 1, true), out)
    assert.truthy(out:find("--overwrite", 1, true), out)
    assert.are.equal(before, #listing(d .. "/out")) -- nothing written
    local keep = assert(io.open(d .. "/out/notes.txt", "w")) -- not a shard: --overwrite leaves it
    keep:write("mine\n")
    keep:close()
    out, rc = run(cmd:format(d, "small.jsonl", d, "out", "--overwrite"))
    assert.are.equal(0, rc, out)
    out, rc = run(cmd:format(d, "small.jsonl", d, "fresh", ""))
    assert.are.equal(0, rc, out)
    local fresh = listing(d .. "/fresh")
    fresh[#fresh + 1] = "notes.txt"
    table.sort(fresh)
    assert.are.same(fresh, listing(d .. "/out")) -- only the new run's shards (and notes.txt)
    for _, name in ipairs(listing(d .. "/fresh")) do
      assert.is_true(os.execute(("cmp -s %s/fresh/%s %s/out/%s"):format(d, name, d, name)) == 0, name)
    end
    local train = lt.data.shards { path = d .. "/out/train", batch = 1, seq = 1, shuffle = false, epochs = 1 }
    local ids = {}
    for x in train:batches() do ids[#ids + 1] = x:item() end
    local text = lt.tokenizer.load():decode(ids)
    assert.is_nil(text:find("big.jsonl", 1, true), text)
    assert.truthy(text:find("small.jsonl document 2", 1, true), text)
    os.execute("rm -rf " .. d)
  end)
  it("range-checks its settings before reading anything: the message alone (was: --shard_size=0 wrote empty shards without end)", function()
    local d = tmpdir()
    local f = assert(io.open(d .. "/docs.jsonl", "w"))
    for i = 1, 4 do f:write(lt.json.encode { text = ("document %d"):format(i) }, "\n") end
    f:close()
    local cases = {
      { "--shard_size=0", "--shard_size must be a whole number >= 1, got 0" },
      { "--val_frac=0", "--val_frac must be a number > 0 and <= 0.5" }, { "--val_frac=nan", "--val_frac must be a number > 0 and <= 0.5 (the share for validation" },
      { "--batch_mb=0", "--batch_mb must be a number > 0, got 0" },
      { "--on_invalid_utf8=skip", '--on_invalid_utf8 must be one of error, replace, got "skip"' },
      { "--field=", '--field must be a non-empty string, got ""' },
      { "--out=" .. d, "prepare: --out=" .. d .. " is not empty" }, -- (a refusal of its own: no traceback either)
    }
    for _, c in ipairs(cases) do
      local out, rc = run(("./lutra recipes/prepare.lua --input=%s/docs.jsonl --out=%s/out --quiet %s"):format(d, d, c[1]))
      assert.are.equal(1, rc, c[1] .. ": " .. out)
      assert.truthy(out:find("lutra: " .. c[2], 1, true), c[1] .. ": " .. out)
      assert.falsy(out:find("traceback", 1, true), c[1] .. ": " .. out)
    end
    assert.are.same({ "docs.jsonl" }, listing(d)) -- nothing written
    os.execute("rm -rf " .. d)
  end)
  it("cuts a single text file in two at a line boundary (train, then val), and refuses one that cannot be cut", function()
    local d = tmpdir()
    local lines = {}
    for i = 1, 40 do lines[i] = ("line %d of the only text\n"):format(i) end
    local f = assert(io.open(d .. "/one.txt", "w"))
    f:write(table.concat(lines))
    f:close()
    local out, rc = run(("./lutra recipes/prepare.lua --input=%s/one.txt --out=%s/out --val_frac=0.1 --quiet"):format(d, d))
    assert.are.equal(0, rc, out)
    local tok = lt.tokenizer.load()
    local function text_of(split)
      local ids = {}
      local l = lt.data.shards { path = d .. "/out/" .. split, batch = 1, seq = 1, shuffle = false, epochs = 1 }
      for x, y in l:batches() do ids[#ids + 1] = x:item() end
      l:close()
      return tok:decode(ids)
    end
    -- (a shard's last token is never a window's input: the <|endoftext|> closing each part)
    local train, val = text_of("train"), text_of("val")
    assert.are.equal(table.concat(lines, "", 1, 36), train)
    assert.are.equal(table.concat(lines, "", 37, 40), val)
    f = assert(io.open(d .. "/short.txt", "w"))
    f:write("just one line of text\n")
    f:close()
    out, rc = run(("./lutra recipes/prepare.lua --input=%s/short.txt --out=%s/short --quiet"):format(d, d))
    assert.are_not.equal(0, rc)
    assert.truthy(out:find(d .. "/short.txt holds a single line, which cannot be cut", 1, true), out)
    assert.truthy(out:find("training would get 0 tokens", 1, true), out)
    assert.falsy(out:find("traceback", 1, true), out)
    assert.is_nil(io.open(d .. "/short")) -- no --out made
    os.execute("rm -rf " .. d)
  end)
end)

describe("lt.config", function()
  it("overrides defaults from --key=value with their types", function()
    local c = lt.config({ steps = 10, lr = 0.1, name = "x", resume = true },
      { "--steps=20", "--lr=3e-4", "--name=run 1", "--no-resume", "extra" })
    assert.are.same({ steps = 20, lr = 3e-4, name = "run 1", resume = false, args = { "extra" } }, c)
    assert.is_true(lt.config({ flag = false }, { "--flag" }).flag)
    H.assert_error(function() lt.config({ steps = 10 }, { "--step=3" }) end, "unknown setting --step", "steps")
    H.assert_error(function() lt.config({ steps = 10 }, { "--steps=many" }) end, "not a number")
    H.assert_error(function() lt.config({ steps = 10 }, { "--steps" }) end, "needs a value")
  end)
  it("suggests the nearest setting for an unknown one, and range-checks values naming the setting", function()
    local d = { steps = 10, lr = 0.1, temperature = 0.8, eval_every = 5, eval_batches = 0 }
    H.assert_error(function() lt.config(d, { "--stpes=3" }) end, "unknown setting --stpes (did you mean --steps?)")
    H.assert_error(function() lt.config(d, { "--temp=1" }) end, "(did you mean --temperature?)")
    H.assert_error(function() lt.config(d, { "--eval_batch=1" }) end, "(did you mean --eval_batches?)")
    local far = H.assert_error(function() lt.config(d, { "--zzz=1" }) end, "unknown setting --zzz; valid: ")
    assert.falsy(far:find("did you mean", 1, true), far)
    assert.are.equal("steps", lt.config.nearest("setps", { "seed", "steps", "seq" }))
    assert.is_nil(lt.config.nearest("batch", { "lr", "seed" }))
    -- recipes/sample.lua --tokens=3 (was: no suggestion)
    assert.are.equal("max_tokens", lt.config.nearest("tokens", { "cache", "max_tokens", "prompt", "top_k", "top_p" }))
    assert.is_nil(lt.config.nearest("top", { "top_k", "top_p" }))
    local c = lt.config(d, { "--steps=-5", "--lr=nan" })
    H.assert_error(function() lt.config.check(c, { steps = { int = true, min = 1 } }) end,
      "--steps must be a whole number >= 1, got -5")
    H.assert_error(function() lt.config.check(c, { lr = { gt = 0, max = 1 } }) end, "--lr must be a number > 0 and <= 1, got nan")
    c.steps, c.lr = 3, 0.1
    lt.config.check(c, { steps = { int = true, min = 1, max = 3 }, lr = { one_of = { 0.1 } } }) -- passes
    H.assert_error(function() lt.config.check(c, { nope = { min = 0 } }) end, "a rule for nope, which is not a setting")
    -- a settings error is a plain string, raised without a position; uncaught, lutra prints it alone
    local ok, err = pcall(lt.config.fail, "--x is wrong")
    assert.is_false(ok)
    assert.are.equal("--x is wrong", err)
    local name = os.tmpname()
    local f = assert(io.open(name, "w"))
    f:write("local lt = require 'lutra'\nlt.config({ steps = 1 }, { '--stepz=2' })\n")
    f:close()
    local p = io.popen("./lutra " .. name .. " 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    os.remove(name)
    assert.truthy(out:find("^lutra: config: unknown setting %-%-stepz %(did you mean %-%-steps%?%)"), out)
    assert.falsy(out:find("traceback", 1, true), out)
    assert.truthy(out:find("rc=1", 1, true), out)
  end)
  it("prints keys, defaults and types for --help", function()
    local p = io.popen("./lutra recipes/prepare.lua --help")
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("--shard_size", 1, true) and out:find("number", 1, true), out)
    -- a default longer than its column goes on a line of its own; the type and text line up below it
    assert.truthy(out:find('\n  %-%-input +"[^\n]+"\n +string +a directory of'), out)
    assert.truthy(out:find("%-%-quiet +false +boolean +no progress line"), out)
    -- lutra's own --help on stdout (it pages), a bad option's usage on stderr with status 1
    p = io.popen("./lutra --help 2>/dev/null")
    out = p:read("*a")
    assert.is_true(p:close())
    assert.truthy(out:find("usage: lutra [options]", 1, true), out)
    p = io.popen("./lutra --no-such-option 2>&1 >/dev/null; echo rc=$?")
    out = p:read("*a")
    p:close()
    assert.truthy(out:find("usage: lutra", 1, true) and out:find("rc=1", 1, true), out)
    -- the main job describes each setting (_help), which is not a setting itself
    p = io.popen("./lutra recipes/gpt2.lua --help")
    out = p:read("*a")
    p:close()
    assert.truthy(out:find("%-%-accum +1 +number +micro%-batches per optimizer step"), out)
    assert.falsy(out:find("_help", 1, true), out)
    local c = lt.config({ steps = 10, _help = { steps = "optimizer steps" } }, { "--steps=3" })
    assert.are.same({ steps = 3, args = {} }, c)
    H.assert_error(function() lt.config({ steps = 10, _help = { step = "typo" } }, {}) end,
      "_help describes step, which is not a setting")
    H.assert_error(function() lt.config({ steps = 10 }, { "--_help=1" }) end, "unknown setting --_help")
    H.assert_error(function() lt.config({ steps = 10, _help = { steps = {} } }, {}) end, "must be a string")
    assert.truthy(out:find('--prompt +"This module provides"'), out)
  end)
end)
