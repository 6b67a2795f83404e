// kvtier_consumer SOCKET: a program built against the installed client
// library (find_package(kvtier)), as an engine is. Prints the daemon's
// version and health; exit status 0 when both calls succeed.
#include <cstdio>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvtier_consumer SOCKET\n");
    return 2;
  }
  auto client = kvtier::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "stats: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  auto health = (*client)->Health();
  if (!health.ok()) {
    std::fprintf(stderr, "health: %s\n", std::string(health.status().message()).c_str());
    return 1;
  }
  std::printf("version=%s serving=%d\n", stats->version().c_str(),
              *health == kvtier::ServingStatus::kServing ? 1 : 0);
  return 0;
}
