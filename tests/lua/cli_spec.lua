-- tests/lua/cli_spec.lua: the lutra executable as a process: running scripts
-- with arg, -e, -l, -i, --threads, --version, exit status and traceback on
-- errors, strict globals in scripts, SIGINT (status 130; lt.train stopping at
-- a complete step), piped REPL input, LUTRA_PATH.
local sh = require("tests.lua.helpers").sh

-- shards of random GPT-2 ids, for runs of the main recipe
local function lt_gen() return require("lutra").Generator(3) end
local function lt_write(path, g, n)
  local lt = require "lutra"
  lt.data.write_shard(path, lt.randint(0, 50257, { n }, { generator = g }):to("i32"), 50257)
end
local cwd = os.getenv("PWD")

local function tmpfile(text)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(text)
  f:close()
  return name
end

describe("the lutra executable", function()
  it("runs a script with arg set as luajit does", function()
    local s = tmpfile("print(arg[0] == ..., select('#', ...), arg[1], arg[2], arg[-1] ~= nil)\n")
    local out, rc = sh("./lutra " .. s .. " a 'b c'")
    assert.are.equal(0, rc)
    assert.truthy(out:find("false\t2\ta\tb c\ttrue", 1, true), out)
    os.remove(s)
  end)
  it("runs -e code with lt predefined, and -l libraries", function()
    local out, rc = sh("./lutra -e 'print(lt.ones(2):sum():item())'")
    assert.are.equal(0, rc)
    assert.truthy(out:find("2", 1, true))
    out = sh("./lutra -l lutra.json -e 'print(type(lutra))'")
    assert.truthy(out:find("nil", 1, true), out) -- -l binds the global named like the module
  end)
  it("the main recipe with --device=cuda and no GPU says so and exits 1, before loading anything", function()
    if require("lutra").cuda.device_count() > 0 then return end
    local out, rc = sh("./lutra recipes/gpt2.lua --device=cuda --steps=1 2>&1")
    assert.are.equal(1, rc)
    assert.truthy(out:find("--device=cuda, but this machine has no CUDA device (", 1, true), out)
    assert.falsy(out:find("traceback", 1, true), out)
  end)
  it("the main recipe range-checks every setting before loading anything: the message alone, naming it", function()
    -- (data and vocab exist, so that each case fails on its own setting)
    local data = os.tmpname() .. "-shards"
    os.execute("mkdir -p " .. data)
    local g = lt_gen()
    lt_write(data .. "/train_000000.bin", g, 4096)
    lt_write(data .. "/val_000000.bin", g, 1024)
    -- (a tiny model and one step: a setting accepted by mistake costs a second, not a training run)
    local base = "./lutra recipes/gpt2.lua --data=" .. data .. " --steps=1 --n_layer=1 --n_embd=16 --seq=8 --batch=1 "
      .. "--eval_every=1 --eval_batches=1 --sample_every=1 --sample_tokens=2"
    local cases = {
      { "steps=-5", "--steps must be a whole number >= 1, got -5" }, { "steps=1.5", "--steps must be a whole number" },
      { "lr=0", "--lr must be a number > 0, got 0" }, { "lr=nan", "--lr must be a number > 0, got nan" },
      { "min_lr=1", "--min_lr=1 is above --lr=0.006" }, { "min_lr=-1", "--min_lr must be a number >= 0" },
      { "eval_batches=-1", "--eval_batches must be a whole number >= 0 (0: all), got -1" },
      { "pad_vocab=-8", "--pad_vocab must be a whole number >= 0 (0: none), got -8" },
      { "name=", '--name must be a non-empty string, got ""' }, { "name=../x", '--name="../x" is not a run name' },
      { "warmup=-1", "--warmup must be" }, { "n_layer=0", "--n_layer must be" }, { "n_head=0", "--n_head must be" },
      { "n_embd=130", "--n_embd=130 is not a multiple of --n_head=4" }, { "seq=0", "--seq must be" },
      { "batch=0", "--batch must be" }, { "batch=200 --eval_batches=0", "--batch=200 is more sequences than the validation shards" }, { "accum=0", "--accum must be" },
      { "weight_decay=-0.1", "--weight_decay must be" }, { "beta2=1", "--beta2 must be a number >= 0 and < 1, got 1" },
      { "clip=-1", "--clip must be" }, { "eval_every=-1", "--eval_every must be" },
      { "sample_every=-1", "--sample_every must be" }, { "sample_tokens=0", "--sample_tokens must be" },
      { "temperature=-1", "--temperature must be a number >= 0 (0: greedy), got -1" },
      { "top_k=-1", "--top_k must be" }, { "top_p=0", "--top_p must be a number > 0 and <= 1" },
      { "seed=-1", "--seed must be" }, { "log_every=0", "--log_every must be" },
      { "ckpt_every=-1", "--ckpt_every must be" }, { "keep_last=-1", "--keep_last must be" },
      { "resume=/no/such", "--resume=/no/such is not a complete checkpoint" },
      { "schedule=cos", '--schedule must be one of linear, cosine, wsd, got "cos"' },
      { "zero=4", "--zero must be one of 0, 1, 2, 3 (a ZeRO stage), got 4" },
      { "dtype=f64", "--dtype must be one of f32, bf16, f16" }, { "device=tpu", '--device must be cpu, cuda or cuda:N, got "tpu"' },
      { "data=/no/such", "--data=/no/such holds no train_*.bin shards" },
      { "vocab=/no/such", "--vocab=/no/such cannot be read" },
      { "log_all_ranks=maybe", "config: --log_all_ranks=maybe is not a boolean" },
      { "threads=-1", "--threads must be a whole number >= 0 and <= 1024 (0: every core), got -1" },
      { "seq=100000", "--seq=100000 does not fit the train shards in --data=" },
      { "stpes=3", "config: unknown setting --stpes (did you mean --steps?)" },
      { "tp=0", "--tp must be a whole number >= 1, got 0" }, { "tp=2", "--tp=2 splits the model across 2 ranks: run under mpirun -np <a multiple of 2>" },
      { "sp", "--sp (sequence parallelism) splits the tokens across --tp ranks: it needs --tp > 1" },
      { "model=bert", '--model must be one of gpt2, llama, got "bert"' },
      { "model=llama --n_kv_head=3", "llama: dim 16, n_heads 4 and n_kv_heads 3 do not fit" },
      { "n_kv_head=-1", "--n_kv_head must be a whole number >= 0" }, { "ffn=-1", "--ffn must be a whole number >= 0" },
      { "pp=0", "--pp must be a whole number >= 1, got 0" },
      { "pp=2", "--pp=2 splits the model into 2 stages across ranks: run under mpirun -np <a multiple of 2>" },
      { "micro_batches=-1", "--micro_batches must be a whole number >= 0 (0: --accum), got -1" },
      { "micro_batches=4 --accum=2", "--micro_batches=4 and --accum=2 are the same setting" },
      { "schedule_pp=zb", '--schedule_pp must be one of gpipe, 1f1b, interleaved, got "zb"' },
      { "virtual_stages=2", "--virtual_stages=2 is a pipeline setting: it needs --pp > 1" },
      { "pp_stages=1,x", '--pp_stages=1,x: "x" is not a whole number of blocks >= 1' },
      { "print_schedule", "--print_schedule=true is a pipeline setting: it needs --pp > 1" },
      { "recompute=some", "gpt2: recompute must be none, full, selective or every:k (k >= 1: every k-th block), got some" },
    }
    local script = {}
    for i, c in ipairs(cases) do
      script[#script + 1] = ("echo '### %d'; %s --%s 2>&1; echo \"rc=$?\""):format(i, base, c[1])
    end
    local out = sh(table.concat(script, "; "))
    local checked = {}
    for i, c in ipairs(cases) do
      local part = out:match("### " .. i .. "\n(.-rc=%d+)")
      assert(part, "case " .. c[1] .. ": no output in\n" .. out)
      assert.truthy(part:find("lutra: " .. c[2], 1, true), c[1] .. ": " .. part)
      assert.truthy(part:find("rc=1", 1, true), c[1] .. ": " .. part)
      assert.falsy(part:find("traceback", 1, true), c[1] .. ": " .. part)
      checked[c[1]:match("^[%w_]+")] = true
    end
    -- every setting --help lists has a bad value above (a prompt can be any text)
    for key in sh("./lutra recipes/gpt2.lua --help"):gmatch("\n  %-%-([%w_]+)") do
      assert(checked[key] or key == "prompt", "no bad value tried for --" .. key)
    end
    os.execute("rm -rf " .. data)
  end)
  it("recipes/sample.lua range-checks its settings before loading a model: the message alone", function()
    -- (was: generate's error, with a traceback, after the model loaded and the prompt was printed)
    local cases = {
      { "--max_tokens=-1", "--max_tokens must be a whole number >= 1" }, { "--temperature=nan", "--temperature must be" },
      { "--top_p=2", "--top_p must be a number > 0 and <= 1" }, { "--top_k=-3", "--top_k must be" },
      { "--seed=-1", "--seed must be" }, { "--dtype=f64", "--dtype must be one of f32, bf16, f16" },
      { "--device=tpu", '--device must be cpu, cuda or cuda:N, got "tpu"' },
      { "--ckpt=/no/such", "sample: --ckpt=/no/such is not a directory" },
    }
    for _, c in ipairs(cases) do
      local out, rc = sh("./lutra recipes/sample.lua --ckpt=. " .. c[1] .. " 2>&1")
      assert.are.equal(1, rc, c[1] .. ": " .. out)
      assert.truthy(out:find("lutra: " .. c[2], 1, true), c[1] .. ": " .. out)
      assert.falsy(out:find("traceback", 1, true), c[1] .. ": " .. out)
    end
  end)
  it("the main recipe samples greedily at --temperature=0, prints memory in MiB, and a resumed finished run without a rate", function()
    local data = os.tmpname() .. "-shards"
    os.execute("mkdir -p " .. data)
    local g = lt_gen()
    lt_write(data .. "/train_000000.bin", g, 4096)
    lt_write(data .. "/val_000000.bin", g, 1024)
    local runs = os.tmpname() .. "-runs"
    local cmd = ("cd %s && %s/lutra %s/recipes/gpt2.lua --data=%s --vocab=%s/data/gpt2.tiktoken --n_layer=1 --n_embd=16 "
      .. "--n_head=2 --seq=16 --batch=2 --steps=2 --eval_every=2 --eval_batches=1 --sample_every=2 --sample_tokens=4 "
      .. "--temperature=0 --ckpt_every=2 --resume=auto"):format(runs, cwd, cwd, data, cwd)
    os.execute("mkdir -p " .. runs)
    local out, rc = sh(cmd)
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("---- sample at step 2 ----", 1, true), out)
    assert.truthy(out:find("memory per rank: parameters [%d.]+ MiB, gradients [%d.]+ MiB, optimizer state [%d.]+ MiB"), out)
    assert.truthy(out:find("done: 2 steps in %d+ s %(%d+ tokens/s%)"), out)
    out, rc = sh(cmd) -- at its last step: nothing to do, and no rate of nothing
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("nothing to do", 1, true), out)
    assert.truthy(out:find("done: 0 steps in 0 s; ", 1, true), out)
    assert.falsy(out:find("nan", 1, true), out)
    os.execute("rm -rf " .. data .. " " .. runs)
  end)
  it("the main recipe's default prompt ends in a word, and make demo keeps its last checkpoint", function()
    local lt = require "lutra"
    local prompt = sh("./lutra recipes/gpt2.lua --help"):match('\n  %-%-prompt +"([^"]*)"')
    assert(prompt, "no --prompt in --help")
    local ids = lt.tokenizer.load("data/gpt2.tiktoken"):encode(prompt)
    local last = lt.tokenizer.load("data/gpt2.tiktoken"):decode({ ids[#ids] })
    assert.falsy(last:match("^%s+$"), ("the prompt %q ends in the whitespace token %q"):format(prompt, last))
    -- (make -n: what make demo runs, run by nothing)
    local line = sh("make -n demo 2>/dev/null"):match("[^\n]*recipes/gpt2%.lua[^\n]*")
    assert(line, "make demo runs no recipes/gpt2.lua")
    local steps, every = line:match("%-%-steps=(%d+)"), line:match("%-%-ckpt_every=(%d+)")
    assert.truthy(every and steps and tonumber(steps) % tonumber(every) == 0, line) -- saves at the last step
    assert.truthy(line:find("--name=demo", 1, true), line) -- runs/demo/ckpt, as the README says
  end)
  it("prints the version, LuaJIT and the backends", function()
    local out, rc = sh("./lutra --version")
    assert.are.equal(0, rc)
    assert.truthy(out:find("lutra %d+%.%d+"), out)
    assert.truthy(out:find("LuaJIT", 1, true), out)
    assert.truthy(out:find("cpu:", 1, true), out)
    assert.truthy(out:find("cuda:", 1, true), out)
    assert.truthy(out:find("mpi:", 1, true), out)
  end)
  it("exits 1 with the message and a traceback on stderr for an uncaught error", function()
    local s = tmpfile("local function f() error('deep trouble') end\nf()\n")
    local out, rc = sh("./lutra " .. s .. " 2>&1 >/dev/null")
    assert.are.equal(1, rc)
    assert.truthy(out:find("deep trouble", 1, true), out)
    assert.truthy(out:find("stack traceback", 1, true), out)
    assert.truthy(out:find(":1:", 1, true), out)
    os.remove(s)
  end)
  it("reports the caller's line for failing ops", function()
    local s = tmpfile("local lt = require 'lutra'\n\nlocal x = lt.zeros(2, 3)\nlocal y = x + lt.zeros(4)\n")
    local out, rc = sh("./lutra " .. s)
    assert.are.equal(1, rc)
    assert.truthy(out:find(":4: add: shapes [2, 3] and [4]", 1, true), out)
    os.remove(s)
  end)
  it("makes scripts strict about globals", function()
    local s = tmpfile("local lt = require 'lutra'\ncount = 1\n")
    local out, rc = sh("./lutra " .. s)
    assert.are.equal(1, rc)
    assert.truthy(out:find("undeclared global 'count'", 1, true), out)
    local s2 = tmpfile("print(undefined_thing)\n")
    out = sh("./lutra " .. s2)
    assert.truthy(out:find("undeclared global 'undefined_thing'", 1, true), out)
    os.remove(s)
    os.remove(s2)
  end)
  it("turns SIGINT into 'interrupted!' and status 130 (128 + SIGINT)", function()
    local out, rc = sh("./lutra -e 'local x = lt.zeros{1} while true do x = x + 1 end' & p=$!; sleep 1; kill -INT $p; wait $p")
    assert.are.equal(130, rc)
    assert.truthy(out:find("interrupted!", 1, true), out)
  end)
  -- a tiny GPT-2 trained on random tokens; the file `started` is created after
  -- step 2, the file `marker`, when not "-", as step 4's update begins, which
  -- then takes 2.5 s of small ops
  local train_script = [[
local lt = require "lutra"
local started, marker = ...
if marker == "-" then marker = nil end
local m = lt.models.gpt2("gpt2-tiny")
local g = lt.Generator(1)
local loader = { next = function()
  local ids = lt.randint(0, 512, { 2, 17 }, { generator = g })
  return ids:narrow(2, 1, 16):contiguous(), ids:narrow(2, 2, 16):contiguous()
end }
local sgd, updates = lt.optim.SGD(m, { lr = 0.01 }), 0
local opt = setmetatable({ step = function(_, a)
  if marker and updates == 3 then
    assert(io.open(marker, "w")):close()
    local t = lt.clock()
    while lt.clock() - t < 2.5 do lt.zeros(1):add(1) end
  end
  sgd:step(a)
  updates = updates + 1
end }, { __index = sgd })
local out = os.tmpname() .. "-runs"
local s = lt.train { model = m, optimizer = opt, train = loader, steps = 1000000, out_dir = out, quiet = false,
  log_every = 1000, on_step = function(rec) if rec.step == 2 then assert(io.open(started, "w")):close() end end }
local with_grad = 0
for _, p in ipairs(m:parameters()) do if p.grad ~= nil then with_grad = with_grad + 1 end end
local last
for line in io.lines(out .. "/run/metrics.jsonl") do last = lt.json.decode(line).step or last end
print("after training", s.interrupted, s.steps, updates, last, with_grad .. " of " .. #m:parameters() .. " gradients")
]]
  it("stops lt.train on SIGINT at the last complete step, with a message, the summary and status 130", function()
    local s = tmpfile(train_script)
    local started = os.tmpname()
    os.remove(started)
    local out, rc = sh("./lutra " .. s .. " " .. started .. " - & p=$!; while [ ! -e " .. started .. " ] && kill -0 $p; do sleep 0.05; done; "
      .. "sleep 0.5; kill -INT $p; wait $p")
    assert.are.equal(130, rc, out)
    -- (during a step's forward or backward, or in its update, which is finished first)
    local step, last = out:match("train: interrupted during step (%d+); the last complete step is (%d+) %(loss [%d.]+%)")
    local grads = "0 of 28" -- (the interrupted step's are dropped)
    if step then
      assert.are.equal(tonumber(step) - 1, tonumber(last), out)
    else
      last = out:match("train: interrupted after step (%d+) %(loss [%d.]+%)")
      assert.truthy(last, out)
      grads = "28 of 28" -- (the step's own)
    end
    -- the summary, the updates made and the metrics end at that step, and the gradients left are that step's or none
    assert.truthy(out:find(("after training\ttrue\t%s\t%s\t%s\t%s gradients"):format(last, last, last, grads), 1, true), out)
    os.remove(s)
    os.remove(started)
  end)
  it("finishes and records an update that a SIGINT interrupts, then stops", function()
    local s = tmpfile(train_script)
    local marker = os.tmpname()
    os.remove(marker)
    local started = os.tmpname()
    local out, rc = sh("./lutra " .. s .. " " .. started .. " " .. marker .. " 2>&1 & p=$!; "
      .. "while [ ! -e " .. marker .. " ] && kill -0 $p; do sleep 0.05; done; kill -INT $p; wait $p")
    assert.are.equal(130, rc, out)
    assert.truthy(out:find("lutra: Ctrl-C: stopping when the step's update is done", 1, true), out)
    assert.truthy(out:find("train: interrupted after step 4 (loss", 1, true), out)
    assert.truthy(out:find("after training\ttrue\t4\t4\t4\t28 of 28 gradients", 1, true), out)
    os.remove(s)
    os.remove(marker)
    os.remove(started)
  end)
  it("finishes a checkpoint that a SIGINT interrupts, then stops lt.train after that step", function()
    -- the SIGINT arrives as the save writes its optimizer file (lt.safetensors.save wrapped: it signals the process itself)
    local s = tmpfile([[
local lt = require "lutra"
local ffi = require "ffi"
pcall(ffi.cdef, "int kill(int, int); int getpid(void);")
local m = lt.models.gpt2("gpt2-tiny")
local g = lt.Generator(1)
local loader = { next = function()
  local ids = lt.randint(0, 512, { 2, 17 }, { generator = g })
  return ids:narrow(2, 1, 16):contiguous(), ids:narrow(2, 2, 16):contiguous()
end, state = function() return { epoch = 0, index = 0 } end, load_state = function() end }
local save, saves = lt.safetensors.save, 0
lt.safetensors.save = function(...) -- (what lt.ckpt.save writes its files with)
  saves = saves + 1
  if saves == 3 then ffi.C.kill(ffi.C.getpid(), 2) end -- (step 2's model.safetensors)
  return save(...)
end
local out = os.tmpname() .. "-runs"
local s = lt.train { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }), train = loader, steps = 5, out_dir = out,
  ckpt_every = 1, log_every = 1000 }
print("after training", s.interrupted, s.steps, lt.ckpt.verify(out .. "/run/ckpt/step_00000002"),
  lt.ckpt.latest(out .. "/run/ckpt"):match("step_%d+$"))
os.execute("rm -rf " .. out)
]])
    local out, rc = sh("./lutra " .. s .. " 2>&1")
    assert.are.equal(130, rc, out)
    assert.truthy(out:find("train: interrupted after step 2 (loss", 1, true), out)
    assert.truthy(out:find("after training\ttrue\t2\ttrue\tstep_00000002", 1, true), out)
    os.remove(s)
  end)
  it("reads piped REPL input without prompts, keeps going after errors and then exits 1", function()
    local s = tmpfile("1 + 2\nerror('oops')\nfor i = 1, 2 do\nprint('i', i)\nend\nlt.tensor{1, 2}\n")
    local out, rc = sh("./lutra < " .. s .. " 2>/dev/null")
    assert.are.equal(1, rc) -- (as a script that raised: a pipeline sees it)
    assert.are.equal("3\ni\t1\ni\t2\ntensor(shape=[2], dtype=f32, device=cpu)\n[1.0000, 2.0000]\n", out)
    os.remove(s)
    local _, rc_clean = sh("echo 'print(1)' | ./lutra")
    assert.are.equal(0, rc_clean)
  end)
  it("keeps the position of errors raised by an entry's calls", function()
    local out = sh("echo 'error(\"boom\")' | ./lutra")
    assert.truthy(out:find("stdin:1: boom", 1, true), out)
  end)
  it("enters the REPL after a script with -i", function()
    local s = tmpfile("x_from_script = 41\n")
    local out = sh("echo 'x_from_script + 1' | ./lutra -i " .. s)
    assert.truthy(out:find("undeclared global", 1, true) or out:find("42", 1, true), out)
    local s2 = tmpfile("rawset(_G, 'y_from_script', 41)\n")
    out = sh("echo 'y_from_script + 1' | ./lutra -i " .. s2)
    assert.truthy(out:find("42", 1, true), out)
    os.remove(s)
    os.remove(s2)
  end)
  it("loads the library from LUTRA_PATH when set", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir .. "/lua/lutra && cp -r lua/lutra/* " .. dir .. "/lua/lutra/")
    local f = assert(io.open(dir .. "/lua/lutra/marker.lua", "w"))
    f:write("return 'from source tree'\n")
    f:close()
    local out = sh("LUTRA_PATH=" .. dir .. " ./lutra -e 'print(require(\"lutra.marker\"))'")
    assert.truthy(out:find("from source tree", 1, true), out)
    out = sh("./lutra -e 'print(pcall(require, \"lutra.marker\"))'")
    assert.truthy(out:find("false", 1, true), out) -- the embedded library has no such module
    os.execute("rm -rf " .. dir)
  end)
  it("sets the CPU threads of kernels (OpenMP) and matrix products (OpenBLAS) with --threads", function()
    local show = "'local ffi = require \"ffi\" ffi.cdef \"int openblas_get_num_threads(void);\" "
      .. "print(lt.get_num_threads(), ffi.C.openblas_get_num_threads())'"
    for _, form in ipairs { "--threads=1", "--threads 1" } do
      local out, rc = sh("./lutra " .. form .. " -e " .. show)
      assert.are.equal(0, rc, out)
      assert.are.equal("1\t1\n", out)
    end
    local out, rc = sh("./lutra --threads=0 -e 'print(1)' 2>&1")
    assert.are.equal(1, rc)
    assert.truthy(out:find("--threads needs a whole number of threads 1..1024, got '0'", 1, true), out)
    out, rc = sh("./lutra recipes/gpt2.lua --threads=1.5 2>&1")
    assert.are.equal(1, rc)
    assert.truthy(out:find("lutra: --threads must be a whole number >= 0 and <= 1024 (0: every core), got 1.5", 1, true), out)
  end)
  it("refuses the recipes' stray arguments and sample.lua's bad settings without a traceback", function()
    for _, cmd in ipairs {
      { "./lutra recipes/gpt2.lua steps=3 2>&1", 'lutra: unexpected argument "steps=3"' },
      { "./lutra recipes/sample.lua --ckpt=nowhere max_tokens=3 2>&1", 'lutra: unexpected argument "max_tokens=3"' },
      { "./lutra recipes/sample.lua --ckpt=nowhere --temperature=-1 2>&1", "lutra: --temperature must be a number >= 0" },
      { "./lutra recipes/sample.lua 2>&1", "lutra: sample: --ckpt=" },
      { "./lutra recipes/prepare.lua out=x 2>&1", 'lutra: unexpected argument "out=x"' },
    } do
      local out, rc = sh(cmd[1])
      assert.are.equal(1, rc, out)
      assert.truthy(out:find(cmd[2], 1, true), out)
      assert.falsy(out:find("traceback", 1, true), out)
    end
  end)
  it("rejects unknown options", function()
    local out, rc = sh("./lutra --bogus")
    assert.are.equal(1, rc)
    assert.truthy(out:find("unrecognized option", 1, true), out)
  end)
end)
