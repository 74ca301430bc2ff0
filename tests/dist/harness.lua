-- tests/dist/harness.lua: a small test runner for specs that run on every
-- rank of an mpirun job. Each test runs on all ranks; a rank's failure is
-- shared with all_reduce (max), so every rank agrees on each result. Rank 0
-- prints "ok N - name" / "not ok N - name" (with each failing rank's
-- message) and, at the end, "dist <file> np=<n>: P passed, F failed".
local lt = require "lutra"

local H = { tests = {} }

function H.test(name, fn) H.tests[#H.tests + 1] = { name, fn } end

--- asserts that fn raises on this rank with every fragment in its message
H.raises = require("tests.lua.helpers").assert_error

--- H.shared_dir(prefix) -> "/tmp/<prefix>-<id>": a path rank 0 chose afresh
-- (from os.tmpname), the same on every rank (shared by the ranks of this
-- node). Collective: every rank calls it. The caller makes the directory.
function H.shared_dir(prefix)
  local name = lt.dist.rank() == 0 and os.tmpname() or ""
  local id = lt.tensor({ #name > 0 and tonumber(name:match("(%w+)$"), 36) or 0 }, { dtype = "i64" })
  lt.dist.broadcast(id)
  return ("/tmp/%s-%d"):format(prefix, id:item())
end

--- H.loader(batches) -> a loader whose next() returns batches[i][1], batches[i][2] in turn, then nothing.
function H.loader(batches)
  local i = 0
  return { next = function()
    i = i + 1
    if batches[i] then return batches[i][1], batches[i][2] end
  end }
end

function H.close(a, b, tol, what)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  assert(d <= (tol or 0), ("%s: max abs difference %g"):format(what or "values", d))
end

function H.run(file)
  local rank, world = lt.dist.init()
  local passed, failed = 0, 0
  for i, t in ipairs(H.tests) do
    local ok, err = pcall(t[2], rank, world)
    -- (H_DEBUG=1: each failure printed at once, before the ranks agree: for one that hangs the agreement)
    if not ok and os.getenv("H_DEBUG") then io.stderr:write(("[rank %d] early: %s\n"):format(rank, tostring(err))) end
    local flag = lt.tensor({ ok and 0 or 1 }, { dtype = "i32" })
    lt.dist.all_reduce(flag, { op = "max" })
    -- every rank reports its message in turn, so failures name the rank
    for r = 0, world - 1 do
      if r == rank and not ok then io.stderr:write(("[rank %d] %s: %s\n"):format(rank, t[1], tostring(err))) end
      lt.dist.barrier()
    end
    if flag:item() == 0 then
      passed = passed + 1
      if rank == 0 then print(("ok %d - %s"):format(i, t[1])) end
    else
      failed = failed + 1
      if rank == 0 then print(("not ok %d - %s"):format(i, t[1])) end
    end
  end
  if rank == 0 then print(("dist %s np=%d: %d passed, %d failed"):format(file, world, passed, failed)) end
end

return H
