-- tests/dist/collectives_spec.lua: lt.dist's collectives on every rank
-- against results computed here: all_reduce (sum, avg, max, min; f32, f64,
-- bf16, i64; async), broadcast, all_gather of unequal lengths,
-- reduce_scatter with rows not divisible by the world size, send/recv,
-- groups and the mesh; and errors raised on every rank for mismatched sizes
-- and dtypes, a bad mesh, a bad root.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

-- rank r's tensor: values r + 1 + k/10 for k = 0..n-1 (distinct per rank)
local function mine(r, n, dtype)
  return (lt.arange(n):to("f64") / 10 + (r + 1)):to(dtype or "f32")
end

H.test("all_reduce sum, avg, max, min in f32 and f64 over 7 elements", function(r, w)
  for _, dt in ipairs { "f32", "f64" } do
    for _, op in ipairs { "sum", "avg", "max", "min" } do
      local t = mine(r, 7, dt)
      lt.dist.all_reduce(t, { op = op })
      local want = lt.zeros({ 7 }, { dtype = "f64" })
      if op == "max" then want = mine(w - 1, 7, "f64") elseif op == "min" then want = mine(0, 7, "f64") else
        for q = 0, w - 1 do want = want + mine(q, 7, "f64") end
        if op == "avg" then want = want / w end
      end
      H.close(t, want, dt == "f32" and 1e-5 or 1e-12, dt .. " " .. op)
    end
  end
end)

H.test("all_reduce of bf16 sums in f32 and of i64 exactly", function(r, w)
  local b = lt.full({ 5 }, 0.01 * (r + 1), { dtype = "bf16" })
  lt.dist.all_reduce(b)
  local want = 0
  for q = 0, w - 1 do want = want + lt.tensor({ 0.01 * (q + 1) }, { dtype = "bf16" }):to("f64"):item() end
  H.close(b, lt.full({ 5 }, want):to("bf16"), 0, "bf16 sum")
  local i = lt.full({ 3 }, 2 ^ 40 + r, { dtype = "i64" })
  lt.dist.all_reduce(i)
  assert(i:totable()[1] == w * 2 ^ 40 + w * (w - 1) / 2, "i64 sum")
end)

H.test("asynchronous all_reduce returns a handle whose wait gives the result", function(r, w)
  local a, b = mine(r, 1000), mine(r, 13)
  local ha = lt.dist.all_reduce(a, { async = true })
  local hb = lt.dist.all_reduce(b, { async = true, op = "max" })
  assert(hb:wait() == b and ha:wait() == a)
  local want = lt.zeros({ 1000 }, { dtype = "f64" })
  for q = 0, w - 1 do want = want + mine(q, 1000, "f64") end
  H.close(a, want, 1e-4, "async sum")
  H.close(b, mine(w - 1, 13), 0, "async max")
end)

H.test("broadcast from every root", function(r, w)
  for root = 0, w - 1 do
    local t = mine(r, 9, "f64")
    lt.dist.broadcast(t, { src = root })
    H.close(t, mine(root, 9, "f64"), 0, "broadcast from " .. root)
  end
end)

H.test("all_gather concatenates unequal lengths in rank order", function(r, w)
  local g = lt.dist.all_gather(lt.full({ r + 1, 3 }, r))
  local rows, at = 0, 1
  for q = 0, w - 1 do rows = rows + q + 1 end
  assert(g:size(1) == rows and g:size(2) == 3, "shape " .. tostring(g:shape()))
  for q = 0, w - 1 do
    H.close(g:narrow(1, at, q + 1), lt.full({ q + 1, 3 }, q), 0, "rows of rank " .. q)
    at = at + q + 1
  end
end)

H.test("reduce_scatter gives each rank its chunk of the sum, rows not divisible by the world size", function(r, w)
  for _, rows in ipairs { 7, 2 * w + 1, w } do
    local full = lt.arange(rows * 2):to("f32"):view(rows, 2) * (r + 1)
    local got = lt.dist.reduce_scatter(full)
    local start, len = lt.dist.chunk(rows, w, r)
    assert(got:size(1) == len, ("rows %d: chunk of %d, got %d"):format(rows, len, got:size(1)))
    local total = w * (w + 1) / 2
    if len > 0 then
      H.close(got, lt.arange(rows * 2):to("f32"):view(rows, 2):narrow(1, start, len) * total, 1e-4, "chunk")
    end
    local avg = lt.dist.reduce_scatter(full, { op = "avg" })
    if len > 0 then H.close(avg, got / w, 1e-5, "avg chunk") end
  end
end)

H.test("send and recv pass a tensor around the ring", function(r, w)
  if w < 2 then return end
  local out, back = mine(r, 6), lt.zeros({ 6 })
  local nxt, prev = (r + 1) % w, (r - 1 + w) % w
  if r % 2 == 0 then
    lt.dist.send(out, nxt)
    lt.dist.recv(back, prev)
  else
    lt.dist.recv(back, prev)
    lt.dist.send(out, nxt)
  end
  H.close(back, mine(prev, 6), 0, "from rank " .. prev)
end)

H.test("isend and irecv: several messages in flight, matched by tag, not by order", function(r, w)
  if w < 2 then return end
  local nxt, prev = (r + 1) % w, (r - 1 + w) % w
  -- receives posted first, in the reverse order of the sends: tags pair them
  local got = {}
  for k = 3, 1, -1 do got[k] = lt.dist.irecv(lt.zeros({ k + 1 }, { dtype = "f64" }), prev, { tag = k }) end
  local sends = {}
  for k = 1, 3 do sends[k] = lt.dist.isend(mine(r, k + 1):to("f64") * k, nxt, { tag = k }) end
  local fails = {}
  for k = 1, 3 do
    local t = got[k]:wait()
    local d = (t - mine(prev, k + 1):to("f64") * k):abs():max():item()
    if d ~= 0 then fails[#fails + 1] = ("tag %d differs by %g"):format(k, d) end
  end
  for k = 1, 3 do sends[k]:wait() end
  assert(#fails == 0, table.concat(fails, "; "))
end)

H.test("irecv of another size fails at its wait naming both sizes; bad tags and peers are refused", function(r, w)
  if w < 2 then return end
  H.raises(function() lt.dist.isend(lt.zeros({ 2 }), r) end, "isend", "not another rank")
  H.raises(function() lt.dist.irecv(lt.zeros({ 2 }), (r + 1) % w, { tag = -1 }) end, "irecv", "tag -1")
  H.raises(function() lt.dist.isend(lt.zeros({ 0 }), (r + 1) % w) end, "isend", "empty")
  if r > 1 then return end
  local other = 1 - r
  if r == 0 then
    lt.dist.isend(lt.ones({ 4 }), other, { tag = 7 }):wait()
    lt.dist.isend(lt.ones({ 2 }), other, { tag = 8 }):wait()
  else
    local big = lt.dist.irecv(lt.zeros({ 3 }), other, { tag = 7 }) -- 16 bytes sent into 12
    H.raises(function() big:wait() end, "rank 0 sent more than the 12 bytes")
    local small = lt.dist.irecv(lt.zeros({ 3 }), other, { tag = 8 }) -- 8 bytes sent, 12 expected
    H.raises(function() small:wait() end, "rank 0 sent 8 bytes, this rank expects 12")
  end
end)

H.test("the mesh puts tensor-parallel ranks next to each other", function(r, w)
  if w % 2 ~= 0 then return end
  local mesh = lt.dist.mesh { tp = 2 }
  assert(mesh.sizes.dp == w / 2 and mesh.coords.tp == r % 2 and mesh.coords.dp == math.floor(r / 2))
  local t = lt.tensor({ r }, { dtype = "f64" })
  lt.dist.all_reduce(t, { group = mesh.tp })
  local base = r - r % 2
  assert(t:item() == base + base + 1, "tp group sum " .. t:item())
  local d = lt.tensor({ r }, { dtype = "f64" })
  lt.dist.all_reduce(d, { group = mesh.dp })
  local want = 0
  for q = r % 2, w - 1, 2 do want = want + q end
  assert(d:item() == want, "dp group sum " .. d:item())
end)

H.test("mismatched sizes and dtypes raise on every rank, naming the rank", function(r, w)
  if w < 2 then return end
  H.raises(function() lt.dist.all_reduce(lt.zeros({ 5 + (r == 1 and 1 or 0) })) end, "all_reduce", "passes", "elements")
  H.raises(function() lt.dist.all_reduce(lt.zeros({ 5 }, { dtype = r == 1 and "f64" or "f32" })) end, "all_reduce",
    "f64")
  H.raises(function() lt.dist.reduce_scatter(lt.zeros({ 4 + (r == 0 and 1 or 0) })) end, "reduce_scatter", "elements")
  H.raises(function() lt.dist.all_gather(lt.zeros({ 1, r == 0 and 2 or 3 })) end, "all_gather", "rows of")
  -- the same element count in another shape: rows differ
  H.raises(function() lt.dist.reduce_scatter(r == 0 and lt.ones({ 4, 3 }) or lt.ones({ 3, 4 })) end, "reduce_scatter",
    "passes")
  -- the job carries on after a refused collective
  local t = lt.ones(3)
  lt.dist.all_reduce(t)
  assert(t:totable()[1] == w)
end)

H.test("bad arguments are errors on every rank", function(r, w)
  H.raises(function() lt.dist.mesh { tp = w + 1 } end, ("mesh: tp %d x pp 1 = %d ranks does not divide the job's %d ranks")
    :format(w + 1, w + 1, w))
  H.raises(function() lt.dist.mesh { dp = w, tp = 2 } end, ("mesh: dp %d x tp 2 x pp 1 = %d, but the job has %d ranks")
    :format(w, 2 * w, w))
  H.raises(function() lt.dist.broadcast(lt.ones(2), { src = w }) end, "root " .. w .. " is not a rank")
  H.raises(function() lt.dist.all_reduce(lt.ones(2), { op = "prod" }) end, "op must be sum, avg, max or min")
  H.raises(function() lt.dist.all_reduce(lt.ones(4):narrow(1, 1, 2):expand(3, 2)) end, "contiguous")
  H.raises(function() lt.dist.chunk(5, 0, 0) end, "chunk: needs whole rows")
  H.raises(function() lt.dist.reduce_scatter(lt.ones({ 4 }, { dtype = "i32" }), { op = "avg" }) end,
    "avg needs a float tensor")
  H.raises(function() lt.dist.broadcast(lt.ones(2), { src = 0.5 }) end, "src must be a whole rank")
end)

H.test("a bad argument on one rank only: it raises its own error, the others name it, the job carries on", function(r, w)
  if w < 2 then return end
  local function one(f_bad, f_good, mine, theirs)
    if r == 1 then H.raises(f_bad, unpack(mine))
    else H.raises(f_good, unpack(theirs)) end
  end
  local ok = function() lt.dist.broadcast(lt.ones(2), { src = 0 }) end
  one(function() lt.dist.broadcast(lt.ones(2), { src = w }) end, ok, { "root " .. w .. " is not a rank" },
    { "broadcast", "rank 1 of the group refused its arguments" })
  one(function() lt.dist.broadcast(lt.ones(2), { src = 0.5 }) end, ok, { "src must be a whole rank" },
    { "rank 1 of the group refused" })
  local sum = function() lt.dist.all_reduce(lt.ones(2)) end
  one(function() lt.dist.all_reduce("x") end, sum, { "expected a tensor" }, { "all_reduce", "rank 1", "refused" })
  one(function() lt.dist.all_reduce(lt.ones(2), { op = "prod" }) end, sum, { "op must be" }, { "rank 1", "refused" })
  one(function() lt.dist.all_reduce(lt.ones({ 2 }, { dtype = "bool" })) end, sum, { "dtype bool is not supported" },
    { "rank 1", "refused" })
  one(function() lt.dist.all_reduce(lt.ones(4):narrow(1, 1, 2):expand(3, 2)) end, sum, { "contiguous" },
    { "rank 1", "refused" })
  -- another collective, or another reduction, is named
  one(function() lt.dist.broadcast(lt.ones(2)) end, sum, { "broadcast", "called all_reduce instead" },
    { "all_reduce", "rank 1 of the group called broadcast instead" })
  one(function() lt.dist.all_reduce(lt.ones(2), { op = "max" }) end, sum, { "another reduction op" },
    { "another reduction op" })
  one(function() lt.dist.barrier() end, sum, { "barrier", "called all_reduce instead" },
    { "rank 1 of the group called barrier instead" })
  local t = lt.ones(3)
  lt.dist.all_reduce(t)
  assert(t:totable()[1] == w)
end)

H.test("the same collective called from another line on one rank raises on every rank, naming each rank's line",
  function(r, w)
  if w < 2 then return end
  local at = debug.getinfo(1, "l").currentline
  local function call(t)
    if r == 0 then lt.dist.all_reduce(t) -- at + 2: an extra call on rank 0 would pair with the others' next one
    else lt.dist.all_reduce(t) end -- at + 3
  end
  local here = "tests/dist/collectives_spec.lua:"
  H.raises(function() call(lt.ones(2)) end, "all_reduce (group 0, call ", "the ranks call it from different places",
    "rank 0 at " .. here .. (at + 2), (w == 2 and "rank 1" or "ranks 1, 2, 3") .. " at " .. here .. (at + 3))
  -- barrier too, and the group stays in step: the next calls pair
  H.raises(function()
    if r == w - 1 then lt.dist.barrier() -- at + 10
    else lt.dist.barrier() end
  end, "barrier (group 0, call ", ("rank %d at %s%d"):format(w - 1, here, at + 10))
  local t = lt.ones(3)
  lt.dist.all_reduce(t)
  assert(t:totable()[1] == w)
end)

H.test("first_error: nil when every rank is fine, else the lowest failing rank and its message on every rank", function(r, w)
  assert(lt.dist.first_error(true) == nil, "all fine")
  local bad, why = lt.dist.first_error(r ~= w - 1 and r ~= 0 or w == 1, ("rank %d: broke \226\156\151"):format(r))
  if w == 1 then return assert(bad == nil) end
  assert(bad == 0 and why == "rank 0: broke \226\156\151", ("got %s %q"):format(tostring(bad), tostring(why)))
  bad, why = lt.dist.first_error(r ~= w - 1, "")
  assert(bad == w - 1 and why == "", "an empty message")
end)

H.run("collectives_spec")
