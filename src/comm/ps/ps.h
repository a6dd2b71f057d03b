// Parameter servers: the built-in trainer's parameter_server strategy. The parameters (and the
// optimizer's state) are one flat float vector cut into contiguous shards of equal size, one per
// ps task (so they balance by bytes); every worker pushes its gradients to every shard and pulls
// the shard's parameters back.
//
// - sync: a shard waits for the gradients of version v from every worker, has the optimizer add
//   them in worker order and divide by the number of workers (the shared-memory allreduce's
//   arithmetic) and apply the result, and moves to version v+1; a worker's push returns the
//   parameters of v+1. The update is the allreduce strategy's, step for step.
// - async: a shard applies each push at once (the gradient divided by the number of workers),
//   unless it was computed on parameters more than `max_staleness` versions old: then it is
//   dropped (and counted). A worker that dies is replaced without stopping the others; the shard
//   remembers how many steps each worker has done, so its replacement goes on from there.
//
// Rank 0 of the workers initializes the shards (from its seeded model or its newest checkpoint)
// and fetches their state for checkpoints. No torch here: the optimizer is the caller's
// (ShardOptimizer), the buffers are plain floats.
//
// Transport: TCP to shards on other hosts; to a shard on the worker's own host, each push's
// gradients and the parameters that come back go through a shared-memory segment the worker
// makes for that shard (comm/shm/segment.h: private to the user), with only the small request
// and reply on the socket.
//
// Wire: the frames of common/wire.h, shared with the TCP store (kind, u64 length, fields). The
// first message on a connection must be kHello with the job's token, and is at most
// wire::kMaxHelloBytes: nothing larger is read before the token is checked. Every call on the
// client takes the timeout it was built with; a shard that does not answer in time gives
// kTimeout, a lost one kUnavailable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "common/wire.h"

namespace trainctl::comm::ps {

// The shard's optimizer, owned by the server once the shard is initialized.
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  virtual float* params() = 0;  // count floats
  // Named state buffers of count floats each (momentum, Adam's moments), in a fixed order.
  virtual std::vector<std::pair<std::string, float*>> state() = 0;
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;
  // Applies the gradient (grads[0][i] + ... + grads[n-1][i]) / divisor, added in that order
  // (count floats each); `step` is the job-wide step it makes. sync: every worker's gradients,
  // divided by their number; async: one push, divided by the number of workers.
  virtual void Apply(const float* const* grads, int n, int divisor, int64_t step) = 0;
};
// Makes a shard's optimizer for `count` floats of a training that takes `total_steps` steps.
using ShardOptimizerFactory = std::function<std::unique_ptr<ShardOptimizer>(int64_t count, int64_t total_steps)>;

struct ServerOptions {
  std::string host = "127.0.0.1";  // the task's own address (TRAINCTL_TASK_ADDR)
  int port = 0;                    // 0: any (see port())
  std::string token;               // the job's; clients must present it
  int workers = 1;                 // pushes a sync version waits for
  bool async = false;
  int max_staleness = 8;
  Duration timeout = std::chrono::seconds(60);  // a sync version waiting for a worker's push
  ShardOptimizerFactory make_optimizer;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Stop()
  int port() const { return port_; }
  // Closes the listener and every connection; joins the threads. Idempotent.
  void Stop();
  // Async pushes dropped for staleness so far.
  int64_t dropped() const;

 private:
  struct State;
  Server(ServerOptions options, int listen_fd, int port);
  void Accept();
  // One connection's own: buffers, and the worker's shared-memory segment when it gave one.
  struct Conn {
    std::vector<float> buf, out;
    void* base = nullptr;
    size_t bytes = 0;
    float* grads() { return static_cast<float*>(base); }
    float* params() { return grads() + bytes / sizeof(float) / 2; }
    void Unmap();
    ~Conn() { Unmap(); }
  };
  void Serve(int fd);
  // The connection's hello: the job's token and which worker it is (-1: not one); false when refused.
  bool Greet(int fd, int* worker);
  // The reply to one request other than a push (state_->mu held).
  std::string Answer(uint8_t op, const std::string& payload, int worker, Conn* conn);
  std::string Init(const std::string& payload);
  std::string ShmAttach(const std::string& payload, Conn* conn);
  bool ServePush(int fd, int worker, uint8_t op, uint64_t len, Conn* c);

  ServerOptions o_;
  int listen_fd_;
  int port_;
  std::unique_ptr<State> state_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  // Connections, each served by a detached thread that closes its fd and says so when it ends.
  std::mutex conns_mu_;
  std::condition_variable conns_cv_;
  std::vector<int> fds_;  // open connections
};

// What a shard holds, for a checkpoint or to initialize it.
struct ShardState {
  int64_t version = 0;  // updates applied
  int64_t optimizer_steps = 0;
  std::vector<float> params;
  std::vector<std::pair<std::string, std::vector<float>>> state;  // the optimizer's, by name
};

struct ClientOptions {
  std::vector<std::string> shards;  // host:port of every ps task, by index
  std::string token;
  int worker = 0;          // this worker's index among the workers (its training rank)
  std::string local_host;  // this worker's host: shards there go through shared memory
  Duration timeout = std::chrono::seconds(60);
};

// One worker's connections to every shard. Not thread-safe.
class Client {
 public:
  // Connects to every shard (retrying while they start, up to the timeout) and says hello.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // Whether the shards hold parameters yet, and (async) how many steps this worker had done
  // before it was replaced (0 for a new worker).
  bool initialized() const { return initialized_; }
  int64_t steps_done() const { return steps_done_; }
  // The step the shards were initialized at (a resumed checkpoint's).
  int64_t init_step() const { return init_step_; }

  // Waits until rank 0 has initialized the shards, up to the timeout.
  Status WaitInitialized();
  // Rank 0: gives each shard its slice of `params` and of each optimizer state buffer (all
  // `count` floats), the optimizer's step count, `step`, the training position, and
  // `total_steps`, the training's length (for the learning-rate schedule).
  Status Init(const float* params, int64_t count, const std::vector<std::pair<std::string, const float*>>& state,
              int64_t optimizer_steps, int64_t step, int64_t total_steps);
  // Fills `params` (count floats) with the shards' parameters; returns the lowest shard version.
  Result<int64_t> Pull(float* params, int64_t count);
  // Pushes `grads` computed on version `base` (the value Pull or the previous PushPull returned)
  // as this worker's step `worker_step`, then fills `params` with the parameters after it (sync:
  // version base+1 on every shard). Returns the new version.
  Result<int64_t> PushPull(const float* grads, float* params, int64_t count, int64_t base, int64_t worker_step);
  // The whole state, assembled from the shards (count floats per buffer).
  Result<ShardState> FetchState(int64_t count);
  // Shards reached through shared memory (after the first PushPull).
  int shm_shards() const;
  // Says this worker has done its last step; returns how many workers have.
  Result<int64_t> Done();
  // How many workers have said Done.
  Result<int64_t> DoneCount();

 private:
  explicit Client(ClientOptions o) : o_(std::move(o)) {}
  // Sends a message (common/wire.h: its kind first) to a shard.
  Status Call(size_t shard, const wire::Writer& message);
  Result<std::string> Reply(size_t shard, Duration wait);
  Status Hello(size_t shard);
  void AttachShm(int64_t count);
  Result<int64_t> Count(uint8_t op);  // shard 0's count of the workers that are done

  struct Link {  // a shard's segment: this worker's gradients, then the parameters it gets back
    void* base = nullptr;
    size_t bytes = 0;
    bool tried = false;
  };
  ClientOptions o_;
  std::vector<int> fds_;
  std::vector<Link> links_;
  bool initialized_ = false;
  int64_t steps_done_ = 0;
  int64_t init_step_ = 0;
};

// The slice [begin, end) of `count` floats that shard `index` of `shards` holds.
std::pair<int64_t, int64_t> ShardRange(int64_t count, int shards, int index);

}  // namespace trainctl::comm::ps
