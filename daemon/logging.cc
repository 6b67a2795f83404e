#include "daemon/logging.h"

#include <memory>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace kvtier::daemon {
namespace {

// %* in the JSON pattern: the message payload, escaped for a JSON string.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static const char kHex[] = "0123456789abcdef";
    for (char c : msg.payload) {
      switch (c) {
        case '"':
          dest.append(std::string_view("\\\""));
          break;
        case '\\':
          dest.append(std::string_view("\\\\"));
          break;
        case '\n':
          dest.append(std::string_view("\\n"));
          break;
        case '\t':
          dest.append(std::string_view("\\t"));
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

void InitLogging(const std::string& level, LogFormat format) {
  auto logger = std::make_shared<spdlog::logger>("kvtierd",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (format == LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","msg":"%*"})");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  }
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace kvtier::daemon
