--- recipes/demo.lua: a short tour of lutra's tensor core, run by `make demo`
-- until the training issue brings the GPT recipe. It fits a linear model to
-- noisy synthetic data by gradient descent with hand-written gradients
-- (autograd arrives with the next issue), printing progress as it goes.
--
--   ./lutra recipes/demo.lua [steps] [lr]
local lt = require "lutra"

local steps = tonumber(arg and arg[1]) or 200
local lr = tonumber(arg and arg[2]) or 0.1
local N, D = 4096, 16 -- samples, features

lt.manual_seed(1337)
local w_true = lt.randn(D, 1)
local X = lt.randn(N, D)
local y = lt.matmul(X, w_true) + lt.randn(N, 1) * 0.1 -- (N, 1)

print(("fitting y = X w on %d samples of %d features (%d threads)"):format(N, D, lt.num_threads()))
local w = lt.zeros(D, 1)
for step = 1, steps do
  local err = lt.matmul(X, w) - y -- (N, 1)
  local loss = (err * err):mean():item()
  -- d(mean(err^2))/dw = 2/N * X^T err
  local grad = lt.matmul(X:t(), err) * (2 / N)
  w:sub_(grad * lr)
  if step == 1 or step % 50 == 0 or step == steps then
    print(("step %4d  loss %.6f"):format(step, loss))
  end
end

local max_err = (w - w_true):abs():max():item()
print(("largest weight error %.4f (noise std 0.1)"):format(max_err))
print("first weights, fitted next to true:")
local side = lt.zeros(4, 2)
side:select(2, 1):copy_(w:narrow(1, 1, 4):squeeze(2))
side:select(2, 2):copy_(w_true:narrow(1, 1, 4):squeeze(2))
print(side)

-- the data path: the Python docs as GPT-2 tokens (make data), one batch of it
local ok, train = pcall(lt.data.shards, { path = "data/pydocs/train", batch = 2, seq = 32, seed = 1 })
if ok then
  local tok = lt.tokenizer.load("data/gpt2.tiktoken")
  local x = train:next()
  print(("\ndata/pydocs: %d tokens in %d windows of 33; a batch of it, decoded:"):format(train:num_tokens(),
    train:num_windows()))
  print((tok:decode(x:select(1, 1)):gsub("\n", " ")))
else
  print("\n(no data/pydocs yet: `make data` prepares the Python docs as token shards)")
end
