// Real dedit-target / dedit-drafter / dedit-router processes on loopback
// with ephemeral ports, over tiny random models written to a temp dir, for
// the service tests: one stack (ServiceCluster), or several stacks behind
// routers that read a stacks file (StackCluster).
//
//   ServiceCluster cluster;                 // models + three processes
//   ASSERT_TRUE(cluster.Start().ok());
//   auto stub = dedit::v1::Generation::NewStub(cluster.RouterChannel());
//   cluster.KillDrafter();  cluster.RestartDrafter();
//
//   StackCluster stacks({.stacks = 3, .routers = 2});
//   ASSERT_TRUE(stacks.Start().ok());
//   stacks.KillStack(1);  stacks.RestartStack(1);
#ifndef DEDIT_TESTS_SERVICES_SERVICE_CLUSTER_H_
#define DEDIT_TESTS_SERVICES_SERVICE_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tiny_model.h"

namespace dedit::testing {

// The number after "<field>:" in /proc/<pid>/status (VmRSS in KiB,
// Threads a count); -1 when the process or the field is gone.
int64_t ProcStatusValue(pid_t pid, const std::string& field);

// One child process; its stdout/stderr go to `log_path`.
class ServiceProcess {
 public:
  // Starts `binary args... --ready_file=<tmp>` and waits (up to
  // `timeout_ms`) for the ready file with the bound ports.
  static absl::StatusOr<std::unique_ptr<ServiceProcess>> Start(
      const std::string& binary, std::vector<std::string> args,
      const std::string& work_dir, const std::string& name,
      int timeout_ms = 60000);
  ~ServiceProcess();  // SIGKILL if still running

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }  // 0 = none
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  void Kill();  // SIGKILL and reap
  // SIGTERM; returns the exit status, or -1 if it did not exit in time.
  int Terminate(int timeout_ms);

 private:
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;
  std::string log_path_;
};

class ServiceCluster {
 public:
  struct Options {
    bool with_drafter = true;
    bool with_tokenizer = true;
    std::vector<std::string> router_flags;
    std::vector<std::string> target_flags;
    std::vector<std::string> drafter_flags;
    // > 0: the drafter checkpoint is lookup-seeded
    // (DrafterConfig::lookup_seed_ngram).
    int drafter_lookup_seed_ngram = 0;
  };
  ServiceCluster();
  explicit ServiceCluster(Options options);
  ~ServiceCluster();

  // Writes the models (once) and starts drafter, target, router.
  absl::Status Start();

  const TinyModelSpec& spec() const { return spec_; }
  std::string target_dir() const { return dir_ + "/target"; }
  std::string drafter_dir() const { return dir_ + "/drafter"; }
  std::string tokenizer_path() const { return dir_ + "/target/tokenizer.json"; }

  std::string router_address() const;
  std::shared_ptr<grpc::Channel> RouterChannel() const;
  std::shared_ptr<grpc::Channel> TargetChannel() const;
  std::shared_ptr<grpc::Channel> DrafterChannel() const;

  ServiceProcess* router() { return router_.get(); }
  ServiceProcess* target() { return target_.get(); }
  ServiceProcess* drafter() { return drafter_.get(); }

  void KillDrafter();
  // Starts the drafter again on its old port.
  absl::Status RestartDrafter();
  void KillTarget();

  // GET http://127.0.0.1:port/metrics body.
  static absl::StatusOr<std::string> Scrape(int metrics_port);
  // Sum of the samples of `name` whose label set contains `label`
  // (e.g. `le="1"`); 0 when absent.
  static double MetricValue(const std::string& text, const std::string& name,
                            const std::string& label = "");

 private:
  absl::Status StartDrafter(int port);

  Options options_;
  TinyModelSpec spec_;
  std::string dir_;
  int drafter_port_ = 0;
  std::unique_ptr<ServiceProcess> drafter_, target_, router_;
};

// N stacks, each a dedit-drafter and the dedit-target that streams context
// to it (one Kubernetes pod), all serving the same tiny models, and routers
// that find the stacks in a stacks file (--stacks_file, re-read every
// 100 ms). Stack i is named "s<i>".
class StackCluster {
 public:
  struct Options {
    int stacks = 3;
    int routers = 1;
    std::vector<std::string> router_flags;
    std::vector<std::string> target_flags;  // every stack's target
  };
  explicit StackCluster(Options options);
  ~StackCluster();

  // Writes the models, starts every stack, writes the stacks file, starts
  // the routers.
  absl::Status Start();

  const TinyModelSpec& spec() const { return spec_; }
  std::string target_dir() const { return dir_ + "/target"; }
  std::string drafter_dir() const { return dir_ + "/drafter"; }
  int num_stacks() const { return static_cast<int>(stacks_.size()); }
  static std::string StackName(int i);

  std::shared_ptr<grpc::Channel> RouterChannel(int router = 0) const;
  ServiceProcess* router(int r) { return routers_[r].get(); }
  ServiceProcess* target(int i) { return stacks_[i].target.get(); }
  ServiceProcess* drafter(int i) { return stacks_[i].drafter.get(); }

  std::shared_ptr<grpc::Channel> TargetChannel(int i) const;
  std::shared_ptr<grpc::Channel> DrafterChannel(int i) const;

  // SIGKILLs both processes of stack i (its pod died).
  void KillStack(int i);
  // Starts stack i again on its old ports.
  absl::Status RestartStack(int i);
  // SIGKILLs stack i's target alone (its container crashed), and starts it
  // again on its old port, streaming to the stack's drafter (Kubernetes
  // restarting the container).
  void KillTarget(int i);
  absl::Status RestartTarget(int i);
  // Rewrites the stacks file (atomically) to list only `stacks`.
  absl::Status WriteStacksFile(const std::vector<int>& stacks);

 private:
  struct Stack {
    int target_port = 0;
    int drafter_port = 0;
    std::unique_ptr<ServiceProcess> drafter, target;
  };
  absl::Status StartStack(int i);
  absl::Status StartTarget(int i);

  Options options_;
  TinyModelSpec spec_;
  std::string dir_;
  std::vector<Stack> stacks_;
  std::vector<std::unique_ptr<ServiceProcess>> routers_;
};

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_SERVICES_SERVICE_CLUSTER_H_
