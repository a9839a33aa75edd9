// The "gradsync" c10d backend (see process_group.hpp).
#include "process_group.hpp"

#include <ATen/ATen.h>
#include <Python.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <sched.h>

namespace gradsync {

// ---- errors, types, operators ----------------------------------------------

// A gradsync error as the RuntimeError Python sees, with gradsync's sentence.
[[noreturn]] static void fail(const char *what, gs_status st) {
  throw std::runtime_error(std::string("gradsync ") + what + " failed: " + gs_status_name(st) + ": " +
                           gs_last_error());
}

static void check(const char *what, gs_status st) {
  if (st != GS_OK)
    fail(what, st);
}

static gs_dtype dtype_of(const at::Tensor &t) {
  switch (t.scalar_type()) {
  case at::kFloat: return GS_F32;
  case at::kDouble: return GS_F64;
  case at::kHalf: return GS_F16;
  case at::kBFloat16: return GS_BF16;
  case at::kInt: return GS_I32;
  case at::kLong: return GS_I64;
  case at::kByte: return GS_U8;
  case at::kChar: return GS_I8;
  case at::kShort: return GS_I16;
  case at::kBool: return GS_BOOL;
  default:
    throw std::invalid_argument(std::string("gradsync: tensors of type ") + c10::toString(t.scalar_type()) +
                                " are not supported (f32, f64, f16, bf16, i64, i32, i16, i8, u8, bool)");
  }
}

static gs_redop redop_of(const c10d::ReduceOp &op) {
  switch (op.op_) {
  case c10d::ReduceOp::SUM: return GS_SUM;
  case c10d::ReduceOp::AVG: return GS_AVG;
  case c10d::ReduceOp::PRODUCT: return GS_PROD;
  case c10d::ReduceOp::MIN: return GS_MIN;
  case c10d::ReduceOp::MAX: return GS_MAX;
  case c10d::ReduceOp::BAND: return GS_BAND;
  case c10d::ReduceOp::BOR: return GS_BOR;
  case c10d::ReduceOp::BXOR: return GS_BXOR;
  default:
    throw std::invalid_argument("gradsync: this ReduceOp is not supported (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
  }
}

static void check_cpu(const at::Tensor &t) {
  if (!t.device().is_cpu())
    throw std::invalid_argument("gradsync: only CPU tensors are supported");
}

// The tensor's data as one contiguous block: the tensor itself, or a
// contiguous copy that `back` writes into it afterwards.
struct Dense {
  explicit Dense(const at::Tensor &t) : orig(t), dense(t.contiguous()) { check_cpu(t); }
  void back() {
    if (!dense.is_same(orig))
      orig.copy_(dense);
  }
  void *ptr() { return dense.data_ptr(); }
  size_t count() const { return (size_t)dense.numel(); }
  at::Tensor orig, dense;
};

// ---- the store bridge ---------------------------------------------------------

static gs_status kv_set(void *arg, const char *key, const void *value, size_t len) {
  auto *store = static_cast<c10d::Store *>(arg);
  try {
    const uint8_t *p = static_cast<const uint8_t *>(value);
    store->set(key, std::vector<uint8_t>(p, p + len));
    return GS_OK;
  } catch (const std::exception &) {
    return GS_ERR_IO;
  }
}

static gs_status kv_get(void *arg, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms) {
  auto *store = static_cast<c10d::Store *>(arg);
  try {
    store->wait({key}, std::chrono::milliseconds(timeout_ms < 1 ? 1 : timeout_ms));
  } catch (const std::exception &) {
    return GS_ERR_TIMEOUT;
  }
  try {
    std::vector<uint8_t> v = store->get(key);
    if (buf && cap)
      std::memcpy(buf, v.data(), v.size() < cap ? v.size() : cap);
    *len_p = v.size();
    return GS_OK;
  } catch (const std::exception &) {
    return GS_ERR_IO;
  }
}

static gs_status kv_add(void *arg, const char *key, int64_t delta, int64_t *value_p) {
  try {
    *value_p = static_cast<c10d::Store *>(arg)->add(key, delta);
    return GS_OK;
  } catch (const std::exception &) {
    return GS_ERR_IO;
  }
}

// ---- Work -----------------------------------------------------------------------

// The name the profiler shows for an operation (torch.profiler,
// record_function), as gloo's "gloo:all_reduce": c10d::Work opens the range
// when the operation is queued and closes it in finish().
static const char *profiling_title(c10d::OpType type) {
  switch (type) {
  case c10d::OpType::BROADCAST: return "gradsync:broadcast";
  case c10d::OpType::ALLREDUCE: return "gradsync:all_reduce";
  case c10d::OpType::ALLREDUCE_COALESCED: return "gradsync:all_reduce_coalesced";
  case c10d::OpType::REDUCE: return "gradsync:reduce";
  case c10d::OpType::ALLGATHER: return "gradsync:all_gather";
  case c10d::OpType::_ALLGATHER_BASE: return "gradsync:_all_gather_base";
  case c10d::OpType::GATHER: return "gradsync:gather";
  case c10d::OpType::SCATTER: return "gradsync:scatter";
  case c10d::OpType::REDUCE_SCATTER: return "gradsync:reduce_scatter";
  case c10d::OpType::_REDUCE_SCATTER_BASE: return "gradsync:_reduce_scatter_base";
  case c10d::OpType::ALLTOALL_BASE: return "gradsync:all_to_all_single";
  case c10d::OpType::ALLTOALL: return "gradsync:all_to_all";
  case c10d::OpType::SEND: return "gradsync:send";
  case c10d::OpType::RECV: return "gradsync:recv";
  case c10d::OpType::RECVANYSOURCE: return "gradsync:recvAnySource";
  case c10d::OpType::BARRIER: return "gradsync:barrier";
  default: return "gradsync:unknown";
  }
}

Work::Work(std::vector<at::Tensor> outputs, c10d::OpType type, int rank)
    : c10d::Work(rank, type, profiling_title(type), outputs), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool Work::isCompleted() { return future_->completed(); }
bool Work::isSuccess() const { return future_->completed() && !future_->hasError(); }
std::exception_ptr Work::exception() const { return future_->hasError() ? future_->exception_ptr() : nullptr; }
std::vector<at::Tensor> Work::result() { return outputs_; }
c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() { return future_; }

bool Work::wait(std::chrono::milliseconds /* gradsync's own deadline bounds it */) {
  future_->wait();
  if (future_->hasError())
    std::rethrow_exception(future_->exception_ptr());
  return true;
}

void Work::complete(std::exception_ptr error) {
  if (error) {
    finish(error);
    future_->setError(error);
  } else {
    finish();
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// ---- the process group ------------------------------------------------------------

ProcessGroupGradsync::ProcessGroupGradsync(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                                           std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(store), timeout_(timeout) {
  gs_ctx_params p;
  gs_ctx_params_init(&p);
  kv_ = gs_kv_store{store_.get(), kv_set, kv_get, kv_add};
  p.rank = rank;
  p.world_size = size;
  p.store = &kv_;
  p.timeout_ms = timeout.count() > 0 && timeout.count() < INT32_MAX ? (int)timeout.count() : -1;
  p.route_hint = std::getenv("MASTER_ADDR"); // the interface that reaches the job's master
  const char *local = std::getenv("LOCAL_RANK"), *local_size = std::getenv("LOCAL_WORLD_SIZE");
  if (local && local_size) {
    p.local_rank = std::atoi(local);
    p.local_size = std::atoi(local_size);
  }
  check("init (context)", gs_ctx_create_with(&p, &ctx_));
  gs_status st = gs_comm_create(ctx_, nullptr, &comm_);
  if (st == GS_OK && (st = gs_comm_create(ctx_, nullptr, &p2p_comm_)) != GS_OK)
    gs_comm_abort(comm_);
  if (st != GS_OK) {
    gs_ctx_destroy(ctx_);
    fail("init (communicator)", st);
  }
  worker_ = std::thread([this] { run(); });
  spare_ = std::thread([this] { run_spare(); });
  p2p_worker_ = std::thread([this] { run_p2p(); });
}

ProcessGroupGradsync::~ProcessGroupGradsync() {
  {
    std::lock_guard<std::mutex> g(lock_);
    stop_ = true;
  }
  cv_.notify_all();
  spare_cv_.notify_all();
  p2p_cv_.notify_all();
  // Python drops the last reference holding the GIL; the worker may need it
  // to finish (a future's Python callbacks run as it completes): let it go.
  PyThreadState *saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  worker_.join();
  spare_.join();
  p2p_worker_.join();
  close();
  if (saved)
    PyEval_RestoreThread(saved);
}

// Python drops a group's last reference on each rank at its own time (at
// destroy_process_group, at exit, or never), so the collective
// gs_comm_destroy would wait GS_TIMEOUT_MS for a rank that never comes. The
// ranks count themselves in through the store for a short while: when all
// came, the communicator closes collectively (no peer still writes into
// it); otherwise it is torn down locally (gs_comm_abort).
void ProcessGroupGradsync::close() {
  const std::string key = "gs.closing";
  bool all = getSize() == 1;
  try {
    int64_t n = store_->add(key, 1);
    for (int i = 0; !all && i < 200; i++) { // 2 s
      all = n >= getSize();
      if (!all) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        n = store_->add(key, 0);
      }
    }
  } catch (const std::exception &) {
    all = false; // the store is gone (the job is ending)
  }
  if (all) {
    gs_comm_destroy(p2p_comm_);
    gs_comm_destroy(comm_);
  } else {
    gs_comm_abort(p2p_comm_);
    gs_comm_abort(comm_);
  }
  gs_ctx_destroy(ctx_);
}

// ---- running operations -------------------------------------------------------------

// One C call of an operation (a list of tensors makes one per tensor):
// start() makes the call's buffers (after the operations before it wrote
// theirs) and starts it non-blocking; finish() copies its results into the
// caller's tensors once it completed. The buffers live here until then.
struct Step {
  std::function<gs_status(Step &, gs_req **)> start;
  std::function<void(Step &)> finish;
  std::vector<Dense> dense;           // the caller's tensors as contiguous blocks
  at::Tensor in, all;                 // staging: concatenated inputs, a gathered output
  std::vector<size_t> sc, sd, rc, rd; // alltoallv's counts and displacements
  std::vector<gs_tensor> list;        // allreduce_multi's tensors
};

struct Op {
  c10::intrusive_ptr<Work> work;
  const char *what; // for errors: "allreduce"
  size_t bytes;     // the data it moves (the larger of input and output)
  std::vector<Step> steps;
  size_t next = 0;       // the step running or to start
  gs_req *req = nullptr; // steps[next] started and not complete
};

// An operation of at most kQuickBytes called while the communicator is idle
// starts on the caller's thread, which tests it for up to kQuickBudget: if
// it completes, the Work is complete when returned (no thread hop either
// way). Otherwise the worker finishes it, and the caller has blocked no
// longer than the budget and one test (a test moves at most the
// operation's data): DDP's buckets still overlap the backward pass.
static constexpr size_t kQuickBytes = 256 << 10;
static constexpr std::chrono::microseconds kQuickBudget(100);
// Spinning longer than a small call takes (the C library's own wait spins
// as long before it yields): the peer may share this CPU, so give it up
// between tests.
static constexpr std::chrono::microseconds kQuickSpin(20);

static void finish_step(const char *what, Step &s, gs_status st) {
  check(what, st);
  if (s.finish)
    s.finish(s);
}

// The caller's try: true when every step completed (the work's outputs
// written); false with op.req the step still running.
bool ProcessGroupGradsync::run_quick(Op &op) {
  auto t0 = std::chrono::steady_clock::now();
  auto until = t0 + kQuickBudget;
  for (; op.next < op.steps.size(); op.next++) {
    Step &s = op.steps[op.next];
    check(op.what, s.start(s, &op.req));
    gs_status st;
    while ((st = gs_req_test(op.req)) == GS_INPROGRESS) {
      auto now = std::chrono::steady_clock::now();
      if (now >= until)
        return false;
      if (now - t0 >= kQuickSpin)
        sched_yield();
    }
    op.req = nullptr; // released by the test
    finish_step(op.what, s, st);
  }
  return true;
}

// The worker's run: every step to its end (the step the caller started
// first), each wait bounded by GS_TIMEOUT_MS.
void ProcessGroupGradsync::run_op(Op &op) {
  for (; op.next < op.steps.size(); op.next++) {
    Step &s = op.steps[op.next];
    if (!op.req)
      check(op.what, s.start(s, &op.req));
    gs_req *req = op.req;
    op.req = nullptr;
    finish_step(op.what, s, gs_req_wait(req));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::enqueue(c10d::OpType type, const char *what,
                                                             std::vector<at::Tensor> outputs, size_t bytes,
                                                             std::vector<Step> steps) {
  std::unique_ptr<Op> op(
      new Op{c10::make_intrusive<Work>(std::move(outputs), type, getRank()), what, bytes, std::move(steps)});
  c10::intrusive_ptr<Work> work = op->work;
  std::unique_lock<std::mutex> g(lock_);
  if (running_ || !queue_.empty() || bytes > kQuickBytes) {
    queue_.push_back(std::move(op)); // behind what runs, in call order
    wake();
    return work;
  }
  running_ = true; // the caller is the communicator's one user now
  g.unlock();
  std::exception_ptr error;
  bool done = true;
  try {
    done = run_quick(*op);
  } catch (...) {
    error = std::current_exception();
  }
  g.lock();
  running_ = false;
  if (!done)
    queue_.push_front(std::move(op)); // started: before anything called since
  wake();
  g.unlock();
  if (done)
    work->complete(error); // no callbacks yet: nobody has the future
  return work;
}

// Wakes a thread to run the queue's first operation when none runs (lock_
// held): the worker, and the spare while a thread completes a future (a
// callback may wait for that operation).
void ProcessGroupGradsync::wake() {
  if (running_ || queue_.empty())
    return;
  cv_.notify_one();
  if (completing_ > 0)
    spare_cv_.notify_one();
}

// The worker runs the queue's first operation, then completes its future,
// which runs its callbacks, without being the communicator's user: one
// operation at a time, in queue order. A callback may wait for a later
// operation (PowerSGD's hook all-reduces inside its callbacks and waits):
// while the worker completes, the spare thread runs what is queued. The
// spare sleeps otherwise (no wake-up per operation).
void ProcessGroupGradsync::run() {
  std::unique_lock<std::mutex> g(lock_);
  for (;;) {
    cv_.wait(g, [this] { return (!running_ && !queue_.empty()) || (stop_ && queue_.empty()); });
    if (queue_.empty())
      return; // stopped, nothing left
    run_front(g);
  }
}

void ProcessGroupGradsync::run_spare() {
  std::unique_lock<std::mutex> g(lock_);
  for (;;) {
    spare_cv_.wait(g, [this] { return stop_ || (completing_ > 0 && !running_ && !queue_.empty()); });
    if (stop_)
      return; // the worker drains the queue
    run_front(g);
  }
}

// Runs the queue's first operation (g: the queue's lock, held on entry and
// on return, released meanwhile), then completes it.
void ProcessGroupGradsync::run_front(std::unique_lock<std::mutex> &g) {
  std::unique_ptr<Op> op = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  g.unlock();
  std::exception_ptr error;
  try {
    run_op(*op);
  } catch (...) {
    error = std::current_exception();
  }
  g.lock();
  running_ = false;
  completing_++;
  wake();
  g.unlock();
  op->work->complete(error);
  op.reset(); // the buffers go without the lock
  g.lock();
  completing_--;
}

// ---- the collectives ------------------------------------------------------------------

static size_t nbytes(const std::vector<at::Tensor> &tensors) {
  size_t n = 0;
  for (const auto &t : tensors)
    n += t.nbytes();
  return n;
}

static Step step(std::function<gs_status(Step &, gs_req **)> start, std::function<void(Step &)> finish = nullptr) {
  Step s;
  s.start = std::move(start);
  s.finish = std::move(finish);
  return s;
}

// Writes every dense block back into its tensor (in-place operations).
static void back_all(Step &s) {
  for (auto &d : s.dense)
    d.back();
}

// Writes the last dense block back (the output after the input).
static void back_last(Step &s) { s.dense.back().back(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::broadcast(std::vector<at::Tensor> &tensors,
                                                               const c10d::BroadcastOptions &opts) {
  int root = (int)opts.rootRank;
  std::vector<Step> steps;
  for (const auto &t : tensors)
    steps.push_back(step(
        [this, t, root](Step &s, gs_req **req) {
          s.dense.emplace_back(t);
          Dense &d = s.dense[0];
          return gs_ibroadcast(comm_, d.ptr(), d.ptr(), d.count(), dtype_of(t), root, req);
        },
        back_all));
  return enqueue(c10d::OpType::BROADCAST, "broadcast", tensors, nbytes(tensors), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allreduce(std::vector<at::Tensor> &tensors,
                                                               const c10d::AllreduceOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  std::vector<Step> steps;
  for (const auto &t : tensors)
    steps.push_back(step(
        [this, t, op](Step &s, gs_req **req) {
          s.dense.emplace_back(t);
          Dense &d = s.dense[0];
          return gs_iallreduce(comm_, d.ptr(), d.ptr(), d.count(), dtype_of(t), op, req);
        },
        back_all));
  return enqueue(c10d::OpType::ALLREDUCE, "allreduce", tensors, nbytes(tensors), std::move(steps));
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupGradsync::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                          const c10d::AllreduceCoalescedOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  std::vector<Step> steps;
  if (!tensors.empty())
    steps.push_back(step(
        [this, tensors, op](Step &s, gs_req **req) {
          for (const auto &t : tensors) {
            if (t.scalar_type() != tensors[0].scalar_type())
              throw std::invalid_argument("gradsync: allreduce_coalesced wants tensors of one type");
            s.dense.emplace_back(t);
          }
          for (auto &d : s.dense)
            s.list.push_back(gs_tensor{d.ptr(), d.ptr(), d.count()});
          return gs_iallreduce_multi(comm_, s.list.data(), s.list.size(), dtype_of(tensors[0]), op, req);
        },
        back_all));
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, nbytes(tensors),
                 std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                                     const c10d::AllgatherOptions &) {
  if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type())
    throw std::invalid_argument("gradsync: _allgather_base wants an output of world_size times the input");
  std::vector<Step> steps;
  steps.push_back(step(
      [this, output, input](Step &s, gs_req **req) {
        s.dense.emplace_back(input);
        s.dense.emplace_back(output);
        return gs_iallgather(comm_, s.dense[0].ptr(), s.dense[1].ptr(), s.dense[0].count(), dtype_of(input), req);
      },
      back_last));
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "allgather", {output}, output.nbytes(), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                                               std::vector<at::Tensor> &inputs,
                                                               const c10d::AllgatherOptions &) {
  if (outputs.size() != inputs.size())
    throw std::invalid_argument("gradsync: allgather wants one output list per input");
  for (size_t i = 0; i < inputs.size(); i++)
    if ((int)outputs[i].size() != getSize())
      throw std::invalid_argument("gradsync: allgather wants world_size outputs per input");
  std::vector<at::Tensor> flat_outputs;
  for (auto &list : outputs)
    flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); i++)
    steps.push_back(step(
        [this, input = inputs[i]](Step &s, gs_req **req) {
          s.dense.emplace_back(input);
          Dense &in = s.dense[0];
          s.all = at::empty({(int64_t)getSize(), (int64_t)in.count()}, input.options());
          return gs_iallgather(comm_, in.ptr(), s.all.data_ptr(), in.count(), dtype_of(input), req);
        },
        [out = outputs[i]](Step &s) {
          for (size_t r = 0; r < out.size(); r++)
            out[r].copy_(s.all[(int64_t)r].view(out[r].sizes()));
        }));
  size_t bytes = nbytes(flat_outputs);
  return enqueue(c10d::OpType::ALLGATHER, "allgather", std::move(flat_outputs), bytes, std::move(steps));
}

// outputs[r][i] is rank r's inputs[i] (the transpose of allgather's
// layout): the inputs travel as one flat block per rank.
c10::intrusive_ptr<c10d::Work>
ProcessGroupGradsync::allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
  if ((int)outputs.size() != getSize())
    throw std::invalid_argument("gradsync: allgather_coalesced wants world_size output lists");
  for (const auto &list : outputs) {
    if (list.size() != inputs.size())
      throw std::invalid_argument("gradsync: allgather_coalesced wants one output per input in each list");
    for (size_t i = 0; i < inputs.size(); i++)
      if (list[i].numel() != inputs[i].numel() || list[i].scalar_type() != inputs[i].scalar_type())
        throw std::invalid_argument("gradsync: allgather_coalesced wants outputs shaped as the inputs");
  }
  std::vector<at::Tensor> flat_outputs;
  for (auto &list : outputs)
    flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
  std::vector<Step> steps;
  if (!inputs.empty())
    steps.push_back(step(
        [this, inputs](Step &s, gs_req **req) {
          std::vector<at::Tensor> flat;
          for (const auto &t : inputs) {
            check_cpu(t);
            flat.push_back(t.reshape({-1}));
          }
          s.in = at::cat(flat);
          s.all = at::empty({(int64_t)getSize(), s.in.numel()}, s.in.options());
          return gs_iallgather(comm_, s.in.data_ptr(), s.all.data_ptr(), (size_t)s.in.numel(), dtype_of(s.in),
                               req);
        },
        [outputs, inputs](Step &s) {
          for (size_t r = 0; r < outputs.size(); r++) {
            int64_t at_elem = 0;
            for (size_t i = 0; i < inputs.size(); i++) {
              int64_t n = inputs[i].numel();
              outputs[r][i].copy_(s.all[(int64_t)r].narrow(0, at_elem, n).view(outputs[r][i].sizes()));
              at_elem += n;
            }
          }
        }));
  size_t bytes = nbytes(flat_outputs);
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", std::move(flat_outputs), bytes,
                 std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                                          const c10d::ReduceScatterOptions &opts) {
  if (input.numel() != output.numel() * getSize() || output.scalar_type() != input.scalar_type())
    throw std::invalid_argument("gradsync: _reduce_scatter_base wants an input of world_size times the output");
  gs_redop op = redop_of(opts.reduceOp);
  std::vector<Step> steps;
  steps.push_back(step(
      [this, output, input, op](Step &s, gs_req **req) {
        s.dense.emplace_back(input);
        s.dense.emplace_back(output);
        Dense &out = s.dense[1];
        return gs_ireduce_scatter(comm_, s.dense[0].ptr(), out.ptr(), out.count(), dtype_of(input), op, req);
      },
      back_last));
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", {output}, input.nbytes(), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce_scatter(std::vector<at::Tensor> &outputs,
                                                                    std::vector<std::vector<at::Tensor>> &inputs,
                                                                    const c10d::ReduceScatterOptions &opts) {
  if (outputs.size() != inputs.size())
    throw std::invalid_argument("gradsync: reduce_scatter wants one input list per output");
  gs_redop op = redop_of(opts.reduceOp);
  std::vector<Step> steps;
  size_t bytes = 0;
  for (size_t i = 0; i < outputs.size(); i++) {
    bytes += nbytes(inputs[i]);
    steps.push_back(step(
        [this, output = outputs[i], ins = inputs[i], op](Step &s, gs_req **req) {
          if ((int)ins.size() != getSize())
            throw std::invalid_argument("gradsync: reduce_scatter wants world_size inputs per output");
          std::vector<at::Tensor> flat;
          for (const auto &t : ins)
            flat.push_back(t.reshape({-1}));
          s.in = at::cat(flat);
          s.dense.emplace_back(output);
          Dense &out = s.dense[0];
          return gs_ireduce_scatter(comm_, s.in.data_ptr(), out.ptr(), out.count(), dtype_of(output), op, req);
        },
        back_all));
  }
  return enqueue(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs, bytes, std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::barrier(const c10d::BarrierOptions &) {
  std::vector<Step> steps;
  steps.push_back(step([this](Step &, gs_req **req) { return gs_ibarrier(comm_, req); }));
  return enqueue(c10d::OpType::BARRIER, "barrier", {}, 0, std::move(steps));
}

// ---- rooted and all-to-all ---------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce(std::vector<at::Tensor> &tensors,
                                                            const c10d::ReduceOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  int root = (int)opts.rootRank;
  std::vector<Step> steps;
  for (const auto &t : tensors)
    steps.push_back(step(
        [this, t, op, root](Step &s, gs_req **req) {
          s.dense.emplace_back(t); // in place on the root; the others' tensors stay as they were
          Dense &d = s.dense[0];
          return gs_ireduce(comm_, d.ptr(), getRank() == root ? d.ptr() : nullptr, d.count(), dtype_of(t), op,
                            root, req);
        },
        back_all));
  return enqueue(c10d::OpType::REDUCE, "reduce", tensors, nbytes(tensors), std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::GatherOptions &opts) {
  int root = (int)opts.rootRank;
  if (inputs.size() != 1 || (getRank() == root && (outputs.size() != 1 || (int)outputs[0].size() != getSize())))
    throw std::invalid_argument("gradsync: gather wants one input, and on the root world_size outputs");
  std::vector<at::Tensor> outs = getRank() == root ? outputs[0] : std::vector<at::Tensor>();
  std::vector<Step> steps;
  steps.push_back(step(
      [this, input = inputs[0], root](Step &s, gs_req **req) {
        s.dense.emplace_back(input);
        Dense &in = s.dense[0];
        if (getRank() == root)
          s.all = at::empty({(int64_t)getSize(), (int64_t)in.count()}, input.options());
        return gs_igather(comm_, in.ptr(), getRank() == root ? s.all.data_ptr() : nullptr, in.count(),
                          dtype_of(input), root, req);
      },
      [outs](Step &s) {
        for (size_t r = 0; r < outs.size(); r++)
          outs[r].copy_(s.all[(int64_t)r].view(outs[r].sizes()));
      }));
  size_t bytes = inputs[0].nbytes() * (size_t)getSize();
  return enqueue(c10d::OpType::GATHER, "gather", outs, bytes, std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::scatter(std::vector<at::Tensor> &outputs,
                                                             std::vector<std::vector<at::Tensor>> &inputs,
                                                             const c10d::ScatterOptions &opts) {
  int root = (int)opts.rootRank;
  if (outputs.size() != 1 || (getRank() == root && (inputs.size() != 1 || (int)inputs[0].size() != getSize())))
    throw std::invalid_argument("gradsync: scatter wants one output, and on the root world_size inputs");
  std::vector<at::Tensor> ins = getRank() == root ? inputs[0] : std::vector<at::Tensor>();
  std::vector<Step> steps;
  steps.push_back(step(
      [this, output = outputs[0], ins, root](Step &s, gs_req **req) {
        s.dense.emplace_back(output);
        if (!ins.empty()) {
          std::vector<at::Tensor> flat;
          for (const auto &t : ins)
            flat.push_back(t.reshape({-1}));
          s.in = at::cat(flat);
        }
        Dense &out = s.dense[0];
        return gs_iscatter(comm_, ins.empty() ? nullptr : s.in.data_ptr(), out.ptr(), out.count(),
                           dtype_of(output), root, req);
      },
      back_all));
  size_t bytes = outputs[0].nbytes() * (size_t)getSize();
  return enqueue(c10d::OpType::SCATTER, "scatter", outputs, bytes, std::move(steps));
}

// Split sizes (rows of dimension 0; empty: equal parts) as element counts
// and displacements.
static void splits_of(const at::Tensor &t, const std::vector<int64_t> &splits, int size, std::vector<size_t> &counts,
                      std::vector<size_t> &displs) {
  int64_t rows = t.dim() ? t.size(0) : 1, row = rows ? t.numel() / rows : 0, at_row = 0;
  if (!splits.empty() && (int)splits.size() != size)
    throw std::invalid_argument("gradsync: alltoall wants world_size split sizes");
  if (splits.empty() && rows % size != 0)
    throw std::invalid_argument("gradsync: alltoall: dimension 0 does not split evenly over the ranks");
  counts.resize((size_t)size);
  displs.resize((size_t)size);
  for (int q = 0; q < size; q++) {
    int64_t n = splits.empty() ? rows / size : splits[(size_t)q];
    counts[(size_t)q] = (size_t)(n * row);
    displs[(size_t)q] = (size_t)(at_row * row);
    at_row += n;
  }
  if (at_row != rows)
    throw std::invalid_argument("gradsync: alltoall: the split sizes do not add up to dimension 0");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                                   std::vector<int64_t> &output_splits,
                                                                   std::vector<int64_t> &input_splits,
                                                                   const c10d::AllToAllOptions &) {
  Step one;
  splits_of(input, input_splits, getSize(), one.sc, one.sd);
  splits_of(output, output_splits, getSize(), one.rc, one.rd);
  if (input.scalar_type() != output.scalar_type())
    throw std::invalid_argument("gradsync: alltoall wants input and output of one type");
  one.start = [this, output, input](Step &s, gs_req **req) {
    s.dense.emplace_back(input);
    s.dense.emplace_back(output);
    return gs_ialltoallv(comm_, s.dense[0].ptr(), s.sc.data(), s.sd.data(), s.dense[1].ptr(), s.rc.data(),
                         s.rd.data(), dtype_of(input), req);
  };
  one.finish = back_last;
  std::vector<Step> steps;
  steps.push_back(std::move(one));
  size_t bytes = std::max(input.nbytes(), output.nbytes());
  return enqueue(c10d::OpType::ALLTOALL_BASE, "alltoall", {output}, bytes, std::move(steps));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::alltoall(std::vector<at::Tensor> &outputs,
                                                              std::vector<at::Tensor> &inputs,
                                                              const c10d::AllToAllOptions &) {
  if ((int)outputs.size() != getSize() || (int)inputs.size() != getSize())
    throw std::invalid_argument("gradsync: alltoall wants world_size inputs and outputs");
  std::vector<Step> steps;
  steps.push_back(step(
      [this, outputs, inputs](Step &s, gs_req **req) {
        std::vector<at::Tensor> flat;
        size_t at_in = 0, at_out = 0;
        for (int q = 0; q < getSize(); q++) {
          flat.push_back(inputs[(size_t)q].reshape({-1}));
          s.sc.push_back((size_t)inputs[(size_t)q].numel());
          s.sd.push_back(at_in);
          at_in += s.sc.back();
          s.rc.push_back((size_t)outputs[(size_t)q].numel());
          s.rd.push_back(at_out);
          at_out += s.rc.back();
        }
        s.in = at::cat(flat);
        s.all = at::empty({(int64_t)at_out}, outputs[0].options());
        return gs_ialltoallv(comm_, s.in.data_ptr(), s.sc.data(), s.sd.data(), s.all.data_ptr(), s.rc.data(),
                             s.rd.data(), dtype_of(inputs[0]), req);
      },
      [outputs](Step &s) {
        for (size_t q = 0; q < outputs.size(); q++)
          outputs[q].copy_(s.all.narrow(0, (int64_t)s.rd[q], (int64_t)s.rc[q]).view(outputs[q].sizes()));
      }));
  size_t bytes = std::max(nbytes(inputs), nbytes(outputs));
  return enqueue(c10d::OpType::ALLTOALL, "alltoall", outputs, bytes, std::move(steps));
}

// ---- point-to-point ----------------------------------------------------------------------

struct ProcessGroupGradsync::P2p {
  c10::intrusive_ptr<Work> work;
  bool is_send;
  int peer, tag;
  std::unique_ptr<Dense> data;
  gs_req *req = nullptr;
  gs_p2p_status status{};
};

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::enqueue_p2p(c10d::OpType type, const at::Tensor &t, int peer,
                                                                 int tag) {
  auto op = std::make_shared<P2p>();
  op->work = c10::make_intrusive<Work>(std::vector<at::Tensor>{t}, type, getRank());
  op->is_send = type == c10d::OpType::SEND;
  op->peer = peer;
  op->tag = tag;
  op->data.reset(new Dense(t));
  dtype_of(t); // refused here, before anything is posted
  {
    std::lock_guard<std::mutex> g(lock_);
    p2p_queue_.push_back(op);
  }
  p2p_cv_.notify_one();
  return op->work;
}

void ProcessGroupGradsync::run_p2p() {
  std::vector<std::shared_ptr<P2p>> active;
  for (;;) {
    std::deque<std::shared_ptr<P2p>> fresh;
    {
      std::unique_lock<std::mutex> g(lock_);
      if (active.empty())
        p2p_cv_.wait(g, [this] { return stop_ || !p2p_queue_.empty(); });
      if (stop_ && active.empty() && p2p_queue_.empty())
        return;
      fresh.swap(p2p_queue_);
    }
    for (auto &op : fresh) { // posted in the caller's order
      Dense &d = *op->data;
      gs_status st = op->is_send ? gs_isend(p2p_comm_, d.ptr(), d.count(), dtype_of(d.dense), op->peer, op->tag, &op->req)
                                 : gs_irecv(p2p_comm_, d.ptr(), d.count(), dtype_of(d.dense), op->peer, op->tag,
                                            &op->status, &op->req);
      if (st == GS_OK) {
        active.push_back(op);
        continue;
      }
      try {
        fail(op->is_send ? "send" : "recv", st);
      } catch (...) {
        op->work->complete(std::current_exception());
      }
    }
    bool moved = false;
    for (size_t i = 0; i < active.size();) {
      auto op = active[i];
      gs_status st = gs_req_test(op->req);
      if (st == GS_INPROGRESS) {
        i++;
        continue;
      }
      moved = true;
      active.erase(active.begin() + (long)i);
      std::exception_ptr error;
      try {
        check(op->is_send ? "send" : "recv", st);
        if (!op->is_send) {
          op->data->back();
          op->work->source_ = op->status.source;
        }
      } catch (...) {
        error = std::current_exception();
      }
      op->work->complete(error);
    }
    if (!moved && !active.empty())
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::send(std::vector<at::Tensor> &tensors, int dst, int tag) {
  if (tensors.size() != 1)
    throw std::invalid_argument("gradsync: send wants one tensor");
  return enqueue_p2p(c10d::OpType::SEND, tensors[0], dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::recv(std::vector<at::Tensor> &tensors, int src, int tag) {
  if (tensors.size() != 1)
    throw std::invalid_argument("gradsync: recv wants one tensor");
  return enqueue_p2p(c10d::OpType::RECV, tensors[0], src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::recvAnysource(std::vector<at::Tensor> &tensors, int tag) {
  if (tensors.size() != 1)
    throw std::invalid_argument("gradsync: recv wants one tensor");
  return enqueue_p2p(c10d::OpType::RECVANYSOURCE, tensors[0], GS_ANY_SOURCE, tag);
}

} // namespace gradsync
