-- tests/gpu/checks.lua: device-only checks, printed as TAP. Where no CUDA
-- device is usable it prints "skipped: no CUDA device (<reason>)" and
-- succeeds. The CUDA backend issue adds the op-by-op comparisons here.
local lt = require "lutra"

local n, why = lt.cuda.device_count()
if n == 0 then
  print(("skipped: no CUDA device (%s)"):format(why or "unknown"))
  os.exit(0)
end

local tests, failed = 0, 0
local function check(name, ok, detail)
  tests = tests + 1
  if ok then
    print(("ok %d - %s"):format(tests, name))
  else
    failed = failed + 1
    print(("not ok %d - %s%s"):format(tests, name, detail and (": " .. detail) or ""))
  end
end

check("lt.cuda.is_available() agrees with device_count()", lt.cuda.is_available())
local info = lt.build_info()
check("build info lists cuda:0", info:find("cuda:0", 1, true) ~= nil, info)
-- until the CUDA backend lands, a cuda tensor is refused with a message naming the device
local ok, err = pcall(lt.zeros, { 2 }, { device = "cuda" })
check("a cuda tensor is refused with a clear message while the backend is missing",
  not ok and tostring(err):find("cuda:0", 1, true) ~= nil, tostring(err))
print("1.." .. tests)
os.exit(failed == 0 and 0 or 1)
