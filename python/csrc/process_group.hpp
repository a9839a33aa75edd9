// The "gradsync" c10d backend: a ProcessGroup over one gradsync
// communicator. Operations run one at a time in call order (the same order
// on every rank, whichever thread called: DDP calls from autograd threads)
// through the C library's non-blocking calls, and return a Work whose
// future completes when the data is there. An operation called while none
// is queued or running starts on the caller's thread and completes there
// when it finishes within a short test (no thread hop); otherwise a worker
// thread (and a spare, see run()) finishes it and runs what is queued.
// The C API does the work; this layer converts tensors, types and errors.
#pragma once

#include "gradsync.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace gradsync {

struct Step; // one C call of an operation (process_group.cpp)
struct Op;   // an operation: its Work and steps

class Work : public c10d::Work {
public:
  Work(std::vector<at::Tensor> outputs, c10d::OpType type, int rank);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override { return source_; }
  void complete(std::exception_ptr error);
  int source_ = -1; // recvAnysource: the rank the message came from

private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupGradsync : public c10d::ProcessGroup {
public:
  ProcessGroupGradsync(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       std::chrono::milliseconds timeout);
  ~ProcessGroupGradsync() override;
  const std::string getBackendName() const override { return "gradsync"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                     const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                     std::vector<at::Tensor> &inputs,
                                                     const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                      const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &output_splits,
                                               std::vector<int64_t> &input_splits,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;

private:
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char *what, std::vector<at::Tensor> outputs,
                                         size_t bytes, std::vector<Step> steps);
  bool run_quick(Op &op);
  void run_op(Op &op);
  void run();
  void run_spare();
  void run_front(std::unique_lock<std::mutex> &g);
  void wake();
  void close();
  // Point-to-point runs apart: a receive must not hold up the collectives
  // queued behind it (nor they it), so sends and receives go to a second
  // communicator and thread, which posts them at once (gs_isend, gs_irecv)
  // and completes them as they finish, in any order.
  struct P2p;
  c10::intrusive_ptr<c10d::Work> enqueue_p2p(c10d::OpType type, const at::Tensor &t, int peer, int tag);
  void run_p2p();

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  gs_kv_store kv_;
  gs_ctx *ctx_ = nullptr;
  gs_comm *comm_ = nullptr;
  std::mutex lock_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_; // called, not yet running (the first may be started)
  bool stop_ = false;
  bool running_ = false;        // a thread runs an operation on comm_ (its one user at a time)
  int completing_ = 0;          // threads completing a future (running its callbacks)
  std::condition_variable spare_cv_;
  std::thread worker_, spare_;
  gs_comm *p2p_comm_ = nullptr;
  std::deque<std::shared_ptr<P2p>> p2p_queue_;
  std::condition_variable p2p_cv_;
  std::thread p2p_worker_;
};

} // namespace gradsync
