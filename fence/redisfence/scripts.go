package redisfence

import "github.com/redis/go-redis/v9"

// The scripts run atomically on the server: nothing else runs between their reads and their
// writes. Each declares every key it touches (KEYS), as Redis Cluster requires, and starts with
// the shebang "#!lua", so that a server over its memory limit refuses it before it runs
// instead of failing a write midway. A Redis script does not roll back: a command that fails
// after another one wrote leaves that write in place. So every script reads and decides first,
// and writes only once nothing it is about to run can fail.
//
// Numbers stay decimal strings: Lua's numbers are doubles and cannot hold every int64. Tokens
// and positions are compared by cmp, on the canonical decimal form Go writes; the decisions
// that need arithmetic (the next era, the next topic record) are made in Go and only compared
// here.

const prelude = `#!lua
local function cmp(a, b)
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then
    if na then return -1 end
    return 1
  end
  local r = 0
  if #a ~= #b then
    if #a < #b then r = -1 else r = 1 end
  else
    for i = 1, #a do
      local x, y = string.byte(a, i), string.byte(b, i)
      if x ~= y then
        if x < y then r = -1 else r = 1 end
        break
      end
    end
  end
  if na then return -r end
  return r
end
local function heldby(k, me)
  local v = redis.call('GET', k)
  return v and v ~= me
end
local function fenceof(k)
  local f = redis.call('HMGET', k, 'era', 'epoch', 'pos', 'claimant')
  return {f[1] or '0', f[2] or '0', f[3] or '-1', f[4] or ''}
end
`

// claimScript is fencecheck.CheckClaim as a conditional write, the rule pgfence's and
// sqlitefence's claiming statements apply: the same era, and a higher epoch, or the same epoch
// already held by this claimant or by nobody on a fence never claimed (a missing fence is the
// zero token, no position, no claimant). A refusal returns the stored state, which Go
// classifies with CheckClaim.
//
// KEYS: fence, its hold, the topic's partitions. ARGV: era, epoch, claimant, partition.
var claimScript = redis.NewScript(prelude + `
if redis.call('EXISTS', KEYS[2]) == 1 then return {'held'} end
local s = fenceof(KEYS[1])
if s[1] == ARGV[1] and (cmp(s[2], ARGV[2]) < 0 or (s[2] == ARGV[2] and
    (s[4] == ARGV[3] or (s[4] == '' and s[1] == '0' and s[2] == '0')))) then
  redis.call('HSET', KEYS[1], 'era', s[1], 'epoch', ARGV[2], 'pos', s[3], 'claimant', ARGV[3])
  redis.call('SADD', KEYS[3], ARGV[4])
  return {'ok', s[3]}
end
return {'no', s[1], s[2], s[3], s[4]}
`)

// holdScript takes a fence or a keyed fence for a transaction (Advance, Admit) and returns
// what it stores: until the transaction commits, rolls back or the hold expires, claims,
// recoveries and other transactions' writes of it wait, as they wait for a row lock in SQL.
// The hold orders writers; it is not what refuses a stale one (the commit's check is).
//
// KEYS: the fence or keyed fence, its hold. ARGV: the transaction, the hold's lifetime in
// milliseconds, the fields to return.
var holdScript = redis.NewScript(prelude + `
if heldby(KEYS[2], ARGV[1]) then return {'held'} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local f = redis.call('HMGET', KEYS[1], unpack(ARGV, 3))
local out = {'ok'}
for i = 1, #f do out[i + 1] = f[i] or '' end
return out
`)

// releaseScript ends a transaction's holds without committing it.
//
// KEYS: the holds. ARGV: the transaction.
var releaseScript = redis.NewScript(prelude + `
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then redis.call('DEL', k) end
end
return {'ok'}
`)

// commitScript is a transaction: its fence advances, its keyed-fence admissions and its
// commands, all or nothing. The first pass reads and decides, writing nothing: each advance
// must present exactly the stored token and a batch starting after the stored position
// (fencecheck.CheckAdvance's rule, as in the SQL stores' conditional UPDATE; a refusal returns
// the stored state for Go to classify), each admission must find the keyed fence as the
// transaction observed it when it decided the verdict, and each command must be one that
// cannot fail on the keys as the earlier commands leave them (types, integer fields). The
// second pass writes. A hold of another transaction on a fence or keyed fence makes it
// answer "held" before anything is written.
//
// KEYS: every key of the transaction. ARGV: the transaction, then its operations, each an
// opcode followed by its arguments, keys given as indexes into KEYS.
var commitScript = redis.NewScript(prelude + commitBody)

const commitBody = `
local me = ARGV[1]
local maxint = 9007199254740991
local function intof(v)
  if not (v == '0' or string.match(v, '^%-?[1-9]%d*$')) or #v > 17 then return nil end
  local n = tonumber(v)
  if n > maxint or n < -maxint then return nil end
  return n
end
local fences, parts, holds = {}, {}, {}
local types, fields, fresh = {}, {}, {}
local function typeof(k)
  if types[k] == nil then types[k] = redis.call('TYPE', k)['ok'] end
  return types[k]
end
local function key(i) return KEYS[tonumber(ARGV[i])] end
local n, i = 0, 2
while i <= #ARGV do
  local op = ARGV[i]
  n = n + 1
  if op == 'adv' then
    local fk, hk, pk = key(i + 1), key(i + 2), key(i + 3)
    if heldby(hk, me) then return {'held'} end
    holds[hk] = true
    local s = fences[fk] or fenceof(fk)
    if not (s[1] == ARGV[i + 4] and s[2] == ARGV[i + 5] and cmp(s[3], ARGV[i + 6]) < 0) then
      return {'no', tostring(n), s[1], s[2], s[3], s[4]}
    end
    fences[fk] = {s[1], s[2], ARGV[i + 7], s[4]}
    parts[pk] = parts[pk] or {}
    parts[pk][ARGV[i + 8]] = true
    i = i + 9
  elseif op == 'adm' then
    local ek, hk = key(i + 1), key(i + 2)
    if heldby(hk, me) then return {'held'} end
    holds[hk] = true
    local e = redis.call('HMGET', ek, 'era', 'epoch', 'seq')
    local same
    if ARGV[i + 3] == '0' then
      same = not e[1]
    else
      same = e[1] == ARGV[i + 4] and e[2] == ARGV[i + 5] and e[3] == ARGV[i + 6]
    end
    if not same then return {'conflict', tostring(n)} end
    i = i + 10
  elseif op == 'hset' or op == 'xadd' then
    local k, want = key(i + 1), 'hash'
    if op == 'xadd' then want = 'stream' end
    local t = typeof(k)
    if t ~= want and t ~= 'none' then return {'command', tostring(n), k .. ' holds a ' .. t} end
    types[k] = want
    local pairs_ = tonumber(ARGV[i + 2])
    if op == 'hset' then
      fields[k] = fields[k] or {}
      for j = 0, pairs_ - 1 do fields[k][ARGV[i + 3 + 2 * j]] = ARGV[i + 4 + 2 * j] end
    end
    i = i + 3 + 2 * pairs_
  elseif op == 'hincrby' then
    local k, f = key(i + 1), ARGV[i + 2]
    local t = typeof(k)
    if t ~= 'hash' and t ~= 'none' then return {'command', tostring(n), k .. ' holds a ' .. t} end
    types[k] = 'hash'
    fields[k] = fields[k] or {}
    local cur = fields[k][f]
    if cur == nil and not fresh[k] then cur = redis.call('HGET', k, f) end
    local v = 0
    if cur then
      v = intof(cur)
      if v == nil then return {'command', tostring(n), k .. ' field ' .. f .. ' is not an integer within 2^53'} end
    end
    local r = v + intof(ARGV[i + 3])
    if r > maxint or r < -maxint then return {'command', tostring(n), k .. ' field ' .. f .. ' would leave 2^53'} end
    fields[k][f] = string.format('%.0f', r)
    i = i + 4
  elseif op == 'set' then
    local k = key(i + 1)
    types[k], fields[k], fresh[k] = 'string', {}, true
    i = i + 3
  elseif op == 'del' then
    local k = key(i + 1)
    types[k], fields[k], fresh[k] = 'none', {}, true
    i = i + 2
  elseif op == 'pexpire' then
    i = i + 3
  else
    return redis.error_reply('redisfence: unknown operation ' .. op)
  end
end
for fk, s in pairs(fences) do
  redis.call('HSET', fk, 'era', s[1], 'epoch', s[2], 'pos', s[3], 'claimant', s[4])
end
for pk, ps in pairs(parts) do
  for p in pairs(ps) do redis.call('SADD', pk, p) end
end
i = 2
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'adv' then
    i = i + 9
  elseif op == 'adm' then
    if ARGV[i + 7] ~= '' then
      redis.call('HSET', key(i + 1), 'era', ARGV[i + 7], 'epoch', ARGV[i + 8], 'seq', ARGV[i + 9])
    end
    i = i + 10
  elseif op == 'hset' or op == 'xadd' then
    local c = tonumber(ARGV[i + 2])
    if op == 'hset' then
      redis.call('HSET', key(i + 1), unpack(ARGV, i + 3, i + 2 + 2 * c))
    else
      redis.call('XADD', key(i + 1), '*', unpack(ARGV, i + 3, i + 2 + 2 * c))
    end
    i = i + 3 + 2 * c
  elseif op == 'hincrby' then
    redis.call('HINCRBY', key(i + 1), ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  elseif op == 'set' then
    redis.call('SET', key(i + 1), ARGV[i + 2])
    i = i + 3
  elseif op == 'del' then
    redis.call('DEL', key(i + 1))
    i = i + 2
  elseif op == 'pexpire' then
    redis.call('PEXPIRE', key(i + 1), ARGV[i + 2])
    i = i + 3
  end
end
for hk in pairs(holds) do
  if redis.call('GET', hk) == me then redis.call('DEL', hk) end
end
return {'ok'}
`

// recoverScript is Recover's compare-and-set: if the fence stores exactly the expected token
// it takes the new one (computed in Go: the next era), keeps the position and records the
// recovery, otherwise it changes nothing.
//
// KEYS: fence, its hold, its recoveries, the topic's partitions. ARGV: expected era, epoch,
// new era, epoch, claimant, reason, partition.
var recoverScript = redis.NewScript(prelude + `
if redis.call('EXISTS', KEYS[2]) == 1 then return {'held'} end
local s = fenceof(KEYS[1])
if s[1] ~= ARGV[1] or s[2] ~= ARGV[2] then return {'no', s[1], s[2]} end
redis.call('HSET', KEYS[1], 'era', ARGV[3], 'epoch', ARGV[4], 'pos', s[3], 'claimant', ARGV[5])
redis.call('SADD', KEYS[4], ARGV[7])
redis.call('XADD', KEYS[3], '*', 'from', s[1] .. '.' .. s[2], 'to', ARGV[3] .. '.' .. ARGV[4], 'reason', ARGV[6])
return {'ok'}
`)

// topicScript stores a topic identity if the record Go decided on is still the next one
// (the stored sequence is the expected one), and, for a recreated topic, moves every fence of
// the topic to the era Go computed (fencecheck.ResetToken) with no claimant and no position
// (a sealed fence, epoch 9223372036854775807, keeps its epoch and claimant),
// each recorded as a recovery, provided every fence is as Go read it and no other one exists.
// Otherwise it answers "retry" (or "held") and changes nothing.
//
// KEYS: identity, its records, the partitions, then per partition its fence, hold and
// recoveries. ARGV: expected sequence, next sequence, id, partitions, reason, count, then per
// partition: partition, read era, read epoch, new era.
var topicScript = redis.NewScript(prelude + `
if (redis.call('HGET', KEYS[1], 'seq') or '0') ~= ARGV[1] then return {'retry'} end
local n = tonumber(ARGV[6])
if n > 0 then
  local listed = {}
  for j = 0, n - 1 do listed[ARGV[7 + 4 * j]] = true end
  for _, p in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    if not listed[p] then return {'retry'} end
  end
  for j = 0, n - 1 do
    if redis.call('EXISTS', KEYS[5 + 3 * j]) == 1 then return {'held'} end
    local s = fenceof(KEYS[4 + 3 * j])
    if s[1] ~= ARGV[8 + 4 * j] or s[2] ~= ARGV[9 + 4 * j] then return {'retry'} end
  end
  for j = 0, n - 1 do
    local a = 7 + 4 * j
    if ARGV[a + 2] == '9223372036854775807' then
      redis.call('HSET', KEYS[4 + 3 * j], 'era', ARGV[a + 3], 'pos', '-1')
    else
      redis.call('HSET', KEYS[4 + 3 * j], 'era', ARGV[a + 3], 'epoch', '0', 'pos', '-1', 'claimant', '')
    end
    redis.call('SADD', KEYS[3], ARGV[a])
    local to = ARGV[a + 2] == '9223372036854775807' and ARGV[a + 2] or '0'
    redis.call('XADD', KEYS[6 + 3 * j], '*', 'from', ARGV[a + 1] .. '.' .. ARGV[a + 2], 'to', ARGV[a + 3] .. '.' .. to, 'reason', ARGV[5])
  end
end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'id', ARGV[3], 'partitions', ARGV[4])
redis.call('XADD', KEYS[2], '*', 'seq', ARGV[2], 'id', ARGV[3], 'partitions', ARGV[4], 'reason', ARGV[5])
return {'ok'}
`)
