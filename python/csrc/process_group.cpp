// The "gradsync" c10d backend (see process_group.hpp).
#include "process_group.hpp"

#include <ATen/ATen.h>
#include <Python.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

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

// The worker takes the turn, runs the next operation, gives the turn up,
// then completes the operation's future, which runs its callbacks: one
// operation at a time, in queue order. A callback may wait for a later
// operation (PowerSGD's hook all-reduces inside its callbacks and waits):
// while the worker completes, the spare thread takes the turn for what is
// queued. The spare sleeps otherwise (no wake-up per operation).
void ProcessGroupGradsync::run() {
  for (;;) {
    std::unique_lock<std::mutex> turn(turn_);
    std::unique_lock<std::mutex> g(lock_);
    cv_.wait(g, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty())
      return; // stopped, nothing left
    run_next(g, turn);
  }
}

void ProcessGroupGradsync::run_spare() {
  for (;;) {
    std::unique_lock<std::mutex> g(lock_);
    spare_cv_.wait(g, [this] { return stop_ || (completing_ > 0 && !queue_.empty()); });
    if (stop_)
      return; // the worker drains the queue
    g.unlock();
    std::unique_lock<std::mutex> turn(turn_);
    g.lock();
    if (!queue_.empty())
      run_next(g, turn);
  }
}

// Runs the queue's first operation holding the turn (g: the queue's lock,
// held on entry, released), then completes it without the turn.
void ProcessGroupGradsync::run_next(std::unique_lock<std::mutex> &g, std::unique_lock<std::mutex> &turn) {
  auto item = std::move(queue_.front());
  queue_.pop_front();
  g.unlock();
  std::exception_ptr error;
  try {
    item.second();
  } catch (...) {
    error = std::current_exception();
  }
  turn.unlock();
  g.lock();
  completing_++;
  if (!queue_.empty())
    spare_cv_.notify_one();
  g.unlock();
  item.first->complete(error);
  g.lock();
  completing_--;
  g.unlock();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                             std::function<void()> body) {
  auto work = c10::make_intrusive<Work>(std::move(outputs), type, getRank());
  {
    std::lock_guard<std::mutex> g(lock_);
    queue_.emplace_back(work, std::move(body));
    if (completing_ > 0) // the worker may be held up in a callback
      spare_cv_.notify_one();
  }
  cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::broadcast(std::vector<at::Tensor> &tensors,
                                                               const c10d::BroadcastOptions &opts) {
  int root = (int)opts.rootRank;
  return enqueue(c10d::OpType::BROADCAST, tensors, [this, tensors, root] {
    for (const auto &t : tensors) {
      Dense d(t);
      check("broadcast", gs_broadcast(comm_, d.ptr(), d.ptr(), d.count(), dtype_of(t), root));
      d.back();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::allreduce(std::vector<at::Tensor> &tensors,
                                                               const c10d::AllreduceOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [this, tensors, op] {
    for (const auto &t : tensors) {
      Dense d(t);
      check("allreduce", gs_allreduce(comm_, d.ptr(), d.ptr(), d.count(), dtype_of(t), op));
      d.back();
    }
  });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupGradsync::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                          const c10d::AllreduceCoalescedOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, tensors, op] {
    std::vector<Dense> dense;
    std::vector<gs_tensor> list;
    for (const auto &t : tensors) {
      if (t.scalar_type() != tensors[0].scalar_type())
        throw std::invalid_argument("gradsync: allreduce_coalesced wants tensors of one type");
      dense.emplace_back(t);
    }
    for (auto &d : dense)
      list.push_back(gs_tensor{d.ptr(), d.ptr(), d.count()});
    if (!list.empty())
      check("allreduce_coalesced",
            gs_allreduce_multi(comm_, list.data(), list.size(), dtype_of(tensors[0]), op));
    for (auto &d : dense)
      d.back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_allgather_base(at::Tensor &output, at::Tensor &input,
                                                                     const c10d::AllgatherOptions &) {
  if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type())
    throw std::invalid_argument("gradsync: _allgather_base wants an output of world_size times the input");
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, [this, output, input] {
    Dense in(input), out(output);
    check("allgather", gs_allgather(comm_, in.ptr(), out.ptr(), in.count(), dtype_of(input)));
    out.back();
  });
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
  return enqueue(c10d::OpType::ALLGATHER, flat_outputs, [this, outputs, inputs] {
    for (size_t i = 0; i < inputs.size(); i++) {
      Dense in(inputs[i]);
      at::Tensor all = at::empty({(int64_t)getSize(), (int64_t)in.count()}, inputs[i].options());
      check("allgather", gs_allgather(comm_, in.ptr(), all.data_ptr(), in.count(), dtype_of(inputs[i])));
      for (int r = 0; r < getSize(); r++)
        outputs[i][r].copy_(all[r].view(outputs[i][r].sizes()));
    }
  });
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
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, flat_outputs, [this, outputs, inputs] {
    if (inputs.empty())
      return;
    std::vector<at::Tensor> flat;
    for (const auto &t : inputs) {
      check_cpu(t);
      flat.push_back(t.reshape({-1}));
    }
    at::Tensor in = at::cat(flat);
    at::Tensor all = at::empty({(int64_t)getSize(), in.numel()}, in.options());
    check("allgather_coalesced", gs_allgather(comm_, in.data_ptr(), all.data_ptr(), (size_t)in.numel(),
                                              dtype_of(in)));
    for (int r = 0; r < getSize(); r++) {
      int64_t at_elem = 0;
      for (size_t i = 0; i < inputs.size(); i++) {
        int64_t n = inputs[i].numel();
        outputs[(size_t)r][i].copy_(all[r].narrow(0, at_elem, n).view(outputs[(size_t)r][i].sizes()));
        at_elem += n;
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                                          const c10d::ReduceScatterOptions &opts) {
  if (input.numel() != output.numel() * getSize() || output.scalar_type() != input.scalar_type())
    throw std::invalid_argument("gradsync: _reduce_scatter_base wants an input of world_size times the output");
  gs_redop op = redop_of(opts.reduceOp);
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [this, output, input, op] {
    Dense in(input), out(output);
    check("reduce_scatter", gs_reduce_scatter(comm_, in.ptr(), out.ptr(), out.count(), dtype_of(input), op));
    out.back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce_scatter(std::vector<at::Tensor> &outputs,
                                                                    std::vector<std::vector<at::Tensor>> &inputs,
                                                                    const c10d::ReduceScatterOptions &opts) {
  if (outputs.size() != inputs.size())
    throw std::invalid_argument("gradsync: reduce_scatter wants one input list per output");
  gs_redop op = redop_of(opts.reduceOp);
  return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, [this, outputs, inputs, op] {
    for (size_t i = 0; i < outputs.size(); i++) {
      if ((int)inputs[i].size() != getSize())
        throw std::invalid_argument("gradsync: reduce_scatter wants world_size inputs per output");
      std::vector<at::Tensor> flat;
      for (const auto &t : inputs[i])
        flat.push_back(t.reshape({-1}));
      at::Tensor all = at::cat(flat);
      Dense out(outputs[i]);
      check("reduce_scatter",
            gs_reduce_scatter(comm_, all.data_ptr(), out.ptr(), out.count(), dtype_of(outputs[i]), op));
      out.back();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::barrier(const c10d::BarrierOptions &) {
  return enqueue(c10d::OpType::BARRIER, {}, [this] { check("barrier", gs_barrier(comm_)); });
}

// ---- rooted and all-to-all ---------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::reduce(std::vector<at::Tensor> &tensors,
                                                            const c10d::ReduceOptions &opts) {
  gs_redop op = redop_of(opts.reduceOp);
  int root = (int)opts.rootRank;
  return enqueue(c10d::OpType::REDUCE, tensors, [this, tensors, op, root] {
    for (const auto &t : tensors) {
      Dense d(t); // in place on the root; the others' tensors stay as they were
      check("reduce", gs_reduce(comm_, d.ptr(), getRank() == root ? d.ptr() : nullptr, d.count(), dtype_of(t),
                                op, root));
      d.back();
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::GatherOptions &opts) {
  int root = (int)opts.rootRank;
  if (inputs.size() != 1 || (getRank() == root && (outputs.size() != 1 || (int)outputs[0].size() != getSize())))
    throw std::invalid_argument("gradsync: gather wants one input, and on the root world_size outputs");
  std::vector<at::Tensor> outs = getRank() == root ? outputs[0] : std::vector<at::Tensor>();
  return enqueue(c10d::OpType::GATHER, outs, [this, outs, inputs, root] {
    Dense in(inputs[0]);
    at::Tensor all;
    if (getRank() == root)
      all = at::empty({(int64_t)getSize(), (int64_t)in.count()}, inputs[0].options());
    check("gather", gs_gather(comm_, in.ptr(), getRank() == root ? all.data_ptr() : nullptr, in.count(),
                              dtype_of(inputs[0]), root));
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].copy_(all[(int64_t)r].view(outs[r].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::scatter(std::vector<at::Tensor> &outputs,
                                                             std::vector<std::vector<at::Tensor>> &inputs,
                                                             const c10d::ScatterOptions &opts) {
  int root = (int)opts.rootRank;
  if (outputs.size() != 1 || (getRank() == root && (inputs.size() != 1 || (int)inputs[0].size() != getSize())))
    throw std::invalid_argument("gradsync: scatter wants one output, and on the root world_size inputs");
  std::vector<at::Tensor> ins = getRank() == root ? inputs[0] : std::vector<at::Tensor>();
  return enqueue(c10d::OpType::SCATTER, outputs, [this, outputs, ins, root] {
    Dense out(outputs[0]);
    at::Tensor all;
    if (!ins.empty()) {
      std::vector<at::Tensor> flat;
      for (const auto &t : ins)
        flat.push_back(t.reshape({-1}));
      all = at::cat(flat);
    }
    check("scatter", gs_scatter(comm_, ins.empty() ? nullptr : all.data_ptr(), out.ptr(), out.count(),
                                dtype_of(outputs[0]), root));
    out.back();
  });
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
  std::vector<size_t> sc, sd, rc, rd;
  splits_of(input, input_splits, getSize(), sc, sd);
  splits_of(output, output_splits, getSize(), rc, rd);
  if (input.scalar_type() != output.scalar_type())
    throw std::invalid_argument("gradsync: alltoall wants input and output of one type");
  return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [this, output, input, sc, sd, rc, rd] {
    Dense in(input), out(output);
    check("alltoall", gs_alltoallv(comm_, in.ptr(), sc.data(), sd.data(), out.ptr(), rc.data(), rd.data(),
                                   dtype_of(input)));
    out.back();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradsync::alltoall(std::vector<at::Tensor> &outputs,
                                                              std::vector<at::Tensor> &inputs,
                                                              const c10d::AllToAllOptions &) {
  if ((int)outputs.size() != getSize() || (int)inputs.size() != getSize())
    throw std::invalid_argument("gradsync: alltoall wants world_size inputs and outputs");
  return enqueue(c10d::OpType::ALLTOALL, outputs, [this, outputs, inputs] {
    std::vector<size_t> sc, sd, rc, rd;
    std::vector<at::Tensor> flat;
    size_t at_in = 0, at_out = 0;
    for (int q = 0; q < getSize(); q++) {
      flat.push_back(inputs[(size_t)q].reshape({-1}));
      sc.push_back((size_t)inputs[(size_t)q].numel());
      sd.push_back(at_in);
      at_in += sc.back();
      rc.push_back((size_t)outputs[(size_t)q].numel());
      rd.push_back(at_out);
      at_out += rc.back();
    }
    at::Tensor in = at::cat(flat), out = at::empty({(int64_t)at_out}, outputs[0].options());
    check("alltoall", gs_alltoallv(comm_, in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(),
                                   rd.data(), dtype_of(inputs[0])));
    for (int q = 0; q < getSize(); q++)
      outputs[(size_t)q].copy_(out.narrow(0, (int64_t)rd[(size_t)q], (int64_t)rc[(size_t)q]).view(outputs[(size_t)q].sizes()));
  });
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
