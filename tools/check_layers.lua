--- tools/check_layers.lua: checks the rules of the source tree's layers
-- (ARCHITECTURE.md, "Layers"), on the tree and on the objects of a build:
--
--   1. a subsystem (a folder: host/core, host/ops, ..., kernels, bindings)
--      includes and calls only subsystems of lower layers (the order below);
--      the calls come from the objects' symbol tables (nm), the includes from
--      the sources' #include lines;
--   2. kernels/ includes nothing of host/ (only the kernel interface,
--      kernels/kernel.h, and its own headers); kernel.h includes the
--      public host/lutra.h (lt_dtype, lt_status, the op enums);
--   3. the test doubles' and backends' switches stay in their own files:
--      no LT_CUDA_EMU / LT_CUDA_EMULATED outside tests/emu/, no LT_WITH_MPI
--      outside host/comm/mpi.c;
--   4. no source file over 800 lines.
--
--   ./lutra tools/check_layers.lua [--build=build] [--graph] [--root=DIR] [--no-objects]
--
-- --root: check the git tree at DIR instead of the current directory;
-- --no-objects: the includes only (no build to read the calls from).
-- Prints each broken rule with the file (and symbol) that breaks it, or one
-- line "check_layers: ok ..."; exits 1 when a rule is broken. --graph also
-- prints the subsystem graph (edges and the files behind them).
local cfg = { build = "build", graph = false, root = nil, objects = true }
for _, a in ipairs(arg) do
  local k, v = a:match("^%-%-([%w_-]+)=(.*)$")
  if k == "build" then cfg.build = v
  elseif k == "root" then cfg.root = v
  elseif a == "--graph" then cfg.graph = true
  elseif a == "--no-objects" then cfg.objects = false
  else
    io.stderr:write("check_layers: unknown argument '" .. a .. "' (known: --build=DIR, --graph, --root=DIR, --no-objects)\n")
    os.exit(2)
  end
end
if cfg.root then
  local ffi = require "ffi"
  ffi.cdef "int chdir(const char *path);"
  if ffi.C.chdir(cfg.root) ~= 0 then io.stderr:write("check_layers: cannot enter " .. cfg.root .. "\n"); os.exit(2) end
end

--- The layers, lowest first: a subsystem may use those of lower layers only.
local LAYERS = {
  { "base" },                -- host/base: status and errors, dtypes, size classes
  { "kernels" },             -- kernels/: compute on descriptors (kernels/kernel.h), nothing of the host's objects
  { "backend" },             -- host/backend: the interface every device backend implements (backend.h)
  { "cpu", "cuda" },         -- host/cpu, host/cuda: the backends (memory, streams, libraries)
  { "core" },                -- host/core: tensors, storages, iteration, the device-to-backend map
  { "ops" },                 -- host/ops: forward ops by family (dispatch to a backend)
  { "autograd" },            -- host/autograd: the tape, the engine, every op's backward rule
  { "comm", "io" },          -- host/comm: collectives; host/io: files, tokenizer, loader
  { "bindings", "app" },     -- bindings/: Lua glue; host/app: main and the REPL
}
local rank = {}
for i, names in ipairs(LAYERS) do for _, n in ipairs(names) do rank[n] = i end end
--- Same-layer pairs allowed one way (a uses b).
local SIDEWAYS = { ["app>bindings"] = true }

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end

--- The subsystem of a source path (nil: outside the layers, e.g. the public host/lutra.h).
local function subsystem(path)
  path = path:gsub("^%./", "")
  if path:match("^kernels/") then return "kernels" end
  if path:match("^bindings/") then return "bindings" end
  local sub = path:match("^host/([%w_-]+)/")
  return sub
end

local problems = {}
local function problem(fmt, ...) problems[#problems + 1] = fmt:format(...) end

local files = {}
-- (the files git tracks and the untracked ones it does not ignore: a new file counts before it is added)
local listing = sh("git ls-files --cached --others --exclude-standard host kernels bindings lua tests tools bench recipes")
for f in listing:gmatch("[^\n]+") do files[#files + 1] = f end

-- rule 4: size; rule 3: switches; includes for rules 1 and 2
local edges = {} -- "a>b" -> { why, ... }
local function edge(a, b, why)
  if not a or not b or a == b then return end
  local k = a .. ">" .. b
  edges[k] = edges[k] or {}
  if #edges[k] < 4 then edges[k][#edges[k] + 1] = why end
end
local function exists(p)
  local f = io.open(p)
  if f then f:close() end
  return f ~= nil
end
local function normalize(p)
  local parts = {}
  for seg in p:gmatch("[^/]+") do
    if seg == ".." then parts[#parts] = nil elseif seg ~= "." then parts[#parts + 1] = seg end
  end
  return table.concat(parts, "/")
end
for _, f in ipairs(files) do
  if f:match("%.[ch]$") or f:match("%.cu$") or f:match("%.cuh$") or f:match("%.cc$") or f:match("%.lua$")
    or f:match("%.py$") or f:match("%.sh$") then
    local h = io.open(f)
    if h then
      local text = h:read("*a")
      h:close()
      local n = select(2, text:gsub("\n", "\n"))
      if n > 800 then problem("%s: %d lines (over 800: split it by purpose)", f, n) end
      if f:match("^host/") or f:match("^kernels/") or f:match("^bindings/") then
        local ln = 0
        for line in (text .. "\n"):gmatch("([^\n]*)\n") do
          ln = ln + 1
          if line:match("^%s*#%s*if") then
            if line:match("LT_CUDA_EMU") then
              problem("%s:%d: an LT_CUDA_EMU conditional outside tests/emu/ (%s)", f, ln, line)
            end
            if line:match("LT_WITH_MPI") and f ~= "host/comm/mpi.c" then
              problem("%s:%d: an LT_WITH_MPI conditional outside host/comm/mpi.c (%s)", f, ln, line)
            end
          end
          local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
          if inc then
            local dir = f:match("^(.*)/[^/]*$") or "."
            local target = normalize(dir .. "/" .. inc)
            if not exists(target) then target = normalize("host/" .. inc) end
            if not exists(target) then target = nil end
            local a = subsystem(f)
            -- (the kernel interface itself rests on the public enums of host/lutra.h)
            local public = f == "kernels/kernel.h" and target == "host/lutra.h"
            if a == "kernels" and target and target:match("^host/") and not public then
              problem("%s:%d: a kernel includes the host's %s (kernels see only kernels/kernel.h)", f, ln, target)
            end
            if target then edge(a, subsystem(target), ("%s includes %s"):format(f, target)) end
          end
        end
      end
    end
  end
end

-- calls: every object's undefined symbols against the objects that define them
local objs = not cfg.objects and "" or sh(("find %s/host %s/kernels %s/bindings -name '*.o' 2>/dev/null"):format(cfg.build, cfg.build, cfg.build))
local defined, wanted, nobj = {}, {}, 0
for o in objs:gmatch("[^\n]+") do
  local src = o:sub(#cfg.build + 2):gsub("%.o$", "")
  -- (objects of sources that no longer exist: a build from before a move)
  local still = exists(src .. ".c") or exists(src .. ".cu")
  local sub = subsystem(src)
  if still and sub then
    nobj = nobj + 1
    for kind, sym in sh("nm " .. o):gmatch("%s([A-Za-z])%s+([%w_.$]+)\n") do
      if kind == "U" then
        wanted[#wanted + 1] = { sub, sym, src }
      elseif kind:match("[TDBRCVW]") then
        defined[sym] = defined[sym] or { sub, src }
      end
    end
  end
end
for _, w in ipairs(wanted) do
  local d = defined[w[2]]
  if d then edge(w[1], d[1], ("%s calls %s (%s)"):format(w[3], w[2], d[2])) end
end
if nobj == 0 and cfg.objects then problem("no objects under %s/: build first (make lutra)", cfg.build) end

local keys = {}
for k in pairs(edges) do keys[#keys + 1] = k end
table.sort(keys)
for _, k in ipairs(keys) do
  local a, b = k:match("^(.-)>(.*)$")
  local ok
  if not rank[a] or not rank[b] then
    ok = false
  else
    ok = rank[b] < rank[a] or SIDEWAYS[k]
  end
  if not ok then
    problem("%s uses %s, a layer not below it: %s", a, b, table.concat(edges[k], "; "))
  end
end
if cfg.graph then
  for _, k in ipairs(keys) do print(("%-20s %s"):format(k:gsub(">", " -> "), edges[k][1])) end
end
if #problems > 0 then
  for _, p in ipairs(problems) do print("check_layers: " .. p) end
  print(("check_layers: %d problem(s)"):format(#problems))
  os.exit(1)
end
print(("check_layers: ok (%d files, %d objects, %d subsystem edges, all downwards)"):format(#files, nobj, #keys))
