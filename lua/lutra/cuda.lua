--- lutra.cuda (lt.cuda): CUDA devices from Lua: device_count, is_available,
-- the caching allocator's memory_stats / reset_peak_memory_stats /
-- empty_cache, synchronize, the profiler (profile_start, profile_phase,
-- profile_stop, profile_table), allow_tf32, deterministic and cuDNN's
-- version and device properties.
local capi = require "lutra.capi"
local tensor = require "lutra.tensor.core"
local ffi, C = capi.ffi, capi.C

local lt = {}

lt.cuda = {
  --- Number of CUDA devices usable now, and the reason when there are none.
  device_count = function()
    local why = ffi.new("const char*[1]")
    local n = C.lt_cuda_device_count(why)
    return n, why[0] ~= nil and ffi.string(why[0]) or nil
  end,
  --- Whether this build has CUDA compiled in and a device is present.
  is_available = function() return C.lt_cuda_device_count(nil) > 0 end,
}

local function cuda_index(device)
  if device == nil then return 0 end
  if type(device) == "number" then
    if device < 0 or device % 1 ~= 0 then error(("a cuda device index is a whole number >= 0, got %s"):format(device), 3) end
    return device
  end
  local code = tensor.device_code(device, 3)
  if code < 256 then error(("expected a cuda device, got '%s'"):format(device), 3) end
  return code - 256
end

--- lt.cuda.memory_stats([device]) -> {allocated=, reserved=, peak=} in bytes
-- for the CUDA caching allocator of a device (index or "cuda:N", default 0):
-- bytes in live tensors, bytes held from the driver (live plus cached), and
-- the peak of live since the start or lt.cuda.reset_peak_memory_stats().
function lt.cuda.memory_stats(device)
  local a, r, p = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.lt_cuda_memory_stats(cuda_index(device), a, r, p)
  return { allocated = tonumber(a[0]), reserved = tonumber(r[0]), peak = tonumber(p[0]) }
end

--- lt.cuda.reset_peak_memory_stats([device]): the peak starts again from what is live now.
function lt.cuda.reset_peak_memory_stats(device) C.lt_cuda_reset_peak(cuda_index(device)) end

--- lt.cuda.empty_cache([device]): gives the allocator's cached blocks back to the driver.
function lt.cuda.empty_cache(device) C.lt_cuda_empty_cache(cuda_index(device)) end

--- lt.cuda.synchronize([device]): waits for the device's queued work; raises
-- the error of a kernel that failed since the last wait.
function lt.cuda.synchronize(device)
  if C.lt_cuda_synchronize(cuda_index(device)) ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
end

--- lt.cuda.profile_start([device]): from now on each piece of work lutra
-- queues on the device's compute stream (a kernel, a cuBLASLt product,
-- cuDNN's attention, a copy) is timed with CUDA events (host/cuda/profile.c).
-- Errors: a profile already running, no such device.
function lt.cuda.profile_start(device)
  if C.lt_cuda_profile_start(cuda_index(device)) ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
end

--- lt.cuda.profile_stop() -> {rows=, total_ms=, dropped=}: waits for the
-- device; rows has one {name=, calls=, ms=} per name, largest ms first (ms:
-- from the event before each piece to its own, summed: a piece's run time
-- while the device has work queued ahead; a wait for the host counts to the
-- next piece); total_ms is the span from profile_start to the last piece;
-- dropped counts pieces untimed beyond 65536. Errors: no profile running, a
-- kernel that failed while profiling.
function lt.cuda.profile_stop()
  local rows, n, total, dropped = ffi.new("lt_cuda_profile_row*[1]"), ffi.new("int[1]"), ffi.new("double[1]"),
    ffi.new("int64_t[1]")
  if C.lt_cuda_profile_stop(rows, n, total, dropped) ~= 0 then error(ffi.string(C.lt_last_error()), 2) end
  local out = {}
  for i = 0, n[0] - 1 do
    local r = rows[0][i]
    out[#out + 1] = { name = ffi.string(r.name), calls = tonumber(r.calls), ms = r.ms }
  end
  C.lt_cuda_profile_free(rows[0])
  return { rows = out, total_ms = total[0], dropped = tonumber(dropped[0]) }
end

--- lt.cuda.profile_phase(name): names the phase of the work that follows
-- ("forward", "backward", "optimizer"; at most 23 bytes): its rows are
-- "name: piece", and profile_table totals each phase. nil ends the phase;
-- profile_start begins with none.
function lt.cuda.profile_phase(name)
  if name ~= nil and type(name) ~= "string" then error("profile_phase: expects a string or nil", 2) end
  C.lt_cuda_profile_phase(name)
end

--- lt.cuda.profile_table(profile[, limit]) -> text: profile_stop's result as a
-- table (name, calls, ms, us per call, % of the span), its first limit rows
-- (default all), a line for the rest, and a line per phase (profile_phase).
function lt.cuda.profile_table(profile, limit)
  if type(profile) ~= "table" or type(profile.rows) ~= "table" then
    error("profile_table: expects what lt.cuda.profile_stop() returned", 2)
  end
  if limit ~= nil and (type(limit) ~= "number" or limit < 0 or limit % 1 ~= 0) then
    error(("profile_table: limit is a whole number >= 0, got %s"):format(tostring(limit)), 2)
  end
  local rows, total_ms = profile.rows, profile.total_ms
  limit = math.min(limit or #rows, #rows)
  local function pct(ms) return total_ms > 0 and 100 * ms / total_ms or 0 end
  local lines = { ("%-52s %7s %10s %10s %6s"):format("work", "calls", "ms", "us/call", "%") }
  local rest, rest_calls = 0, 0
  for i, r in ipairs(rows) do
    if i <= limit then
      lines[#lines + 1] = ("%-52s %7d %10.3f %10.1f %6.1f"):format(r.name, r.calls, r.ms, 1e3 * r.ms / r.calls,
        pct(r.ms))
    else
      rest, rest_calls = rest + r.ms, rest_calls + r.calls
    end
  end
  if #rows > limit then
    lines[#lines + 1] = ("%-52s %7d %10.3f %10s %6.1f"):format(("(%d more)"):format(#rows - limit), rest_calls, rest,
      "", pct(rest))
  end
  local phases, order = {}, {}
  for _, r in ipairs(rows) do
    local ph = r.name:match("^([^:]+): ")
    if ph then
      if not phases[ph] then phases[ph], order[#order + 1] = { ms = 0, calls = 0 }, ph end
      phases[ph].ms, phases[ph].calls = phases[ph].ms + r.ms, phases[ph].calls + r.calls
    end
  end
  for _, ph in ipairs(order) do
    lines[#lines + 1] = ("%-52s %7d %10.3f %10s %6.1f"):format("phase " .. ph, phases[ph].calls, phases[ph].ms, "",
      pct(phases[ph].ms))
  end
  lines[#lines + 1] = ("%-52s %7s %10.3f"):format("total (start to the last piece)", "", total_ms)
  if profile.dropped > 0 then lines[#lines + 1] = ("(%d pieces untimed: past 65536)"):format(profile.dropped) end
  return table.concat(lines, "\n")
end

--- lt.cuda.allow_tf32(on): lets f32 matrix products on CUDA round their inputs
-- to TF32 (as torch.backends.cuda.matmul.allow_tf32); off by default.
function lt.cuda.allow_tf32(on) C.lt_cuda_set_allow_tf32(on and 1 or 0) end
--- lt.cuda.deterministic(on): attention gradients from cuDNN repeat bit for
-- bit (its backward without atomic adds; more workspace); off by default.
-- Read at the forward: an attention's backward follows the setting its
-- forward ran under.
function lt.cuda.deterministic(on) C.lt_cuda_set_deterministic(on and 1 or 0) end
--- lt.cuda.cudnn_device_properties([device]) -> cuDNN's description of the
-- device (JSON; cuDNN 9.8+), what cuDNN plans for without the device
-- (tests/ref/cudnn-device-h200.json). Raises where cuDNN cannot say.
function lt.cuda.cudnn_device_properties(device)
  local cap = 65536
  local buf, len = ffi.new("char[?]", cap), ffi.new("int64_t[1]")
  if C.lt_cudnn_device_properties(cuda_index(device), buf, cap, len) ~= 0 then
    error(ffi.string(C.lt_last_error()), 2)
  end
  return ffi.string(buf, tonumber(len[0]))
end
--- lt.cuda.cudnn_version(): the cuDNN attention uses, as a number (91900 for
-- 9.19.0, as torch.backends.cudnn.version()), or nil where none loads.
function lt.cuda.cudnn_version()
  local v = tonumber(C.lt_cudnn_version())
  return v > 0 and v or nil
end

return lt.cuda
