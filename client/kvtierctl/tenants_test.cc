// kvtierctl tenants add / list / rotate on files in a temp folder, each
// result parsed back with toml++ (as the daemon reads it) and its hashes
// checked against HashToken of the printed tokens.
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "client/kvtierctl/commands.h"
#include "client/kvtierctl/credentials.h"
#include "client/kvtierctl/tenants_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/auth/token.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::ctl {
namespace {

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    file_ = dir_ + "/tenants.toml";
  }

  struct Result {
    int code;
    std::string out, err;
  };
  Result Add(TenantAddOptions add) {
    add.file = file_;
    std::ostringstream out, err;
    const int code = RunTenantsAdd(add, GlobalOptions(), out, err);
    return {code, out.str(), err.str()};
  }
  Result Add(const std::string& name) {
    TenantAddOptions add;
    add.name = name;
    return Add(add);
  }
  Result Rotate(const std::string& name, bool revoke_others) {
    std::ostringstream out, err;
    const int code = RunTenantsRotate({name, file_, revoke_others}, GlobalOptions(), out, err);
    return {code, out.str(), err.str()};
  }
  Result List(bool json = false) {
    std::ostringstream out, err;
    GlobalOptions options;
    options.json = json;
    const int code = RunTenantsList(file_, options, out, err);
    return {code, out.str(), err.str()};
  }
  std::string FileText() {
    std::ifstream in(file_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  mode_t FileMode() {
    struct stat st;
    EXPECT_EQ(stat(file_.c_str(), &st), 0);
    return st.st_mode & 07777;
  }
  // The tenants array as the daemon's parser sees it.
  toml::table Parsed() { return toml::parse_file(file_); }

  ::kvtier::testing::ScopedTempDir tmp_{"tenants"};
  std::string dir_, file_;
};

// The printed token: one line on stdout.
std::string TokenOf(const std::string& out) {
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  return out.substr(0, out.find('\n'));
}

TEST_F(TenantsTest, AddCreatesThePrivateFileAndStoresOnlyTheHash) {
  Result r = Add("engine-a");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string token = TokenOf(r.out);
  EXPECT_EQ(token.size(), 43u);
  EXPECT_EQ(FileMode(), 0600);
  EXPECT_NE(r.err.find("kill -HUP"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("systemctl reload kvtierd"), std::string::npos) << r.err;
  EXPECT_EQ(FileText().find(token), std::string::npos) << "the token itself was written";

  toml::table root = Parsed();
  const toml::array* tenants = root["tenants"].as_array();
  ASSERT_NE(tenants, nullptr);
  ASSERT_EQ(tenants->size(), 1u);
  const toml::table& t = *(*tenants)[0].as_table();
  EXPECT_EQ(t["name"].value<std::string>(), "engine-a");
  EXPECT_EQ(t["role"].value<std::string>(), "data");
  const toml::array* hashes = t["token_sha256"].as_array();
  ASSERT_NE(hashes, nullptr);
  ASSERT_EQ(hashes->size(), 1u);
  EXPECT_EQ((*hashes)[0].value<std::string>(), auth::HashToken(token));
  EXPECT_FALSE(t.contains("quotas"));
}

TEST_F(TenantsTest, AddWritesRoleQuotasAndCertNamesAndKeepsComments) {
  {
    std::ofstream out(file_);
    out << "# hand-written: keep me\n";
  }
  ASSERT_EQ(chmod(file_.c_str(), 0640), 0);
  ASSERT_EQ(Add("engine-a").code, 0);
  TenantAddOptions add;
  add.name = "ops.admin_1";
  add.role = "admin";
  add.quotas = {"device_bytes=256MiB", "staging_slots=64", "host_bytes=1073741824"};
  add.cert_names = {"ops \"admin\"", "ops-2"};
  Result r = Add(add);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string token = TokenOf(r.out);
  EXPECT_EQ(FileText().rfind("# hand-written: keep me\n", 0), 0u) << FileText();
  EXPECT_EQ(FileMode(), 0640) << "a rewrite keeps the file's mode";

  toml::table root = Parsed();
  const toml::array* tenants = root["tenants"].as_array();
  ASSERT_EQ(tenants->size(), 2u);
  const toml::table& t = *(*tenants)[1].as_table();
  EXPECT_EQ(t["name"].value<std::string>(), "ops.admin_1");
  EXPECT_EQ(t["role"].value<std::string>(), "admin");
  EXPECT_EQ(t["token_sha256"][0].value<std::string>(), auth::HashToken(token));
  EXPECT_EQ(t["cert_names"][0].value<std::string>(), "ops \"admin\"");
  EXPECT_EQ(t["cert_names"][1].value<std::string>(), "ops-2");
  EXPECT_EQ(t["quotas"]["device_bytes"].value<std::string>(), "256MiB");
  EXPECT_EQ(t["quotas"]["staging_slots"].value<int64_t>(), 64);
  EXPECT_TRUE(t["quotas"]["staging_slots"].is_integer());
  EXPECT_EQ(t["quotas"]["host_bytes"].value<int64_t>(), 1073741824);
}

TEST_F(TenantsTest, UidsAreWrittenKeptAndUniqueAcrossTenants) {
  TenantAddOptions add;
  add.name = "local-engine";
  add.uids = {1001, 1002};
  Result r = Add(add);
  ASSERT_EQ(r.code, 0) << r.err;
  toml::table root = Parsed();
  const toml::table& t = *(*root["tenants"].as_array())[0].as_table();
  EXPECT_EQ(t["uids"][0].value<int64_t>(), 1001);
  EXPECT_EQ(t["uids"][1].value<int64_t>(), 1002);
  // A later rewrite keeps them; another tenant cannot take one.
  ASSERT_EQ(Add("engine-b").code, 0);
  EXPECT_EQ((*Parsed()["tenants"].as_array())[0].as_table()->at("uids").as_array()->size(), 2u);
  TenantAddOptions dup;
  dup.name = "thief";
  dup.uids = {1002};
  Result refused = Add(dup);
  EXPECT_NE(refused.code, 0);
  EXPECT_THAT(refused.err, ::testing::HasSubstr("--uid 1002"));
  // A hand-written bad entry is refused naming uids.
  std::ofstream(file_, std::ios::app) << "[[tenants]]\nname = \"bad\"\nrole = \"data\"\n"
                                      << "uids = [-3]\n";
  Result bad = Add("engine-c");
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("uids"));
}

TEST_F(TenantsTest, DuplicateOrInvalidNamesAreRefusedAndTheFileIsUnchanged) {
  ASSERT_EQ(Add("engine-a").code, 0);
  const std::string before = FileText();
  Result dup = Add("engine-a");
  EXPECT_EQ(dup.code, 2);
  EXPECT_NE(dup.err.find("\"engine-a\" already exists"), std::string::npos) << dup.err;
  EXPECT_TRUE(dup.out.empty()) << "no token may be printed for a refused add";
  for (const std::string& bad :
       {std::string("has space"), std::string("slash/"), std::string(""), std::string(65, 'a')}) {
    Result r = Add(bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.err.find("[A-Za-z0-9._-]"), std::string::npos) << r.err;
  }
  EXPECT_EQ(FileText(), before);
}

TEST_F(TenantsTest, InvalidNameDoesNotCreateTheFile) {
  EXPECT_EQ(Add("no!").code, 2);
  EXPECT_FALSE(std::filesystem::exists(file_));
}

TEST_F(TenantsTest, BadQuotasRoleAndCertNamesAreUsageErrors) {
  TenantAddOptions add;
  add.name = "a";
  add.quotas = {"gpu_bytes=1"};
  Result r = Add(add);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--quota gpu_bytes: unknown quota"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("staging_slots"), std::string::npos) << "lists the known keys";

  add.quotas = {"device_bytes=lots"};
  r = Add(add);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--quota device_bytes: a size"), std::string::npos) << r.err;

  add.quotas = {"contexts=4KiB"};
  r = Add(add);
  EXPECT_NE(r.err.find("--quota contexts: a non-negative integer"), std::string::npos) << r.err;

  add.quotas = {"contexts=4", "contexts=5"};
  EXPECT_NE(Add(add).err.find("given twice"), std::string::npos);

  add.quotas.clear();
  add.role = "root";
  EXPECT_NE(Add(add).err.find("--role root"), std::string::npos);

  add.role = "data";
  add.cert_names = {"cn-1"};
  ASSERT_EQ(Add(add).code, 0);
  add.name = "b";
  r = Add(add);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--cert-name cn-1: already listed by tenant \"a\""), std::string::npos)
      << r.err;
}

TEST_F(TenantsTest, ListShowsTenantsButNeverHashes) {
  TenantAddOptions add;
  add.name = "engine-a";
  add.quotas = {"device_bytes=256MiB", "contexts=8"};
  ASSERT_EQ(Add(add).code, 0);
  add = TenantAddOptions();
  add.name = "ops";
  add.role = "admin";
  ASSERT_EQ(Add(add).code, 0);
  ASSERT_EQ(Rotate("ops", false).code, 0);

  Result r = List();
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string header, a, ops;
  std::getline(lines, header);
  std::getline(lines, a);
  std::getline(lines, ops);
  EXPECT_NE(header.find("TOKENS"), std::string::npos);
  EXPECT_EQ(a.rfind("engine-a", 0), 0u) << a;
  EXPECT_NE(a.find("data"), std::string::npos) << a;
  EXPECT_NE(a.find(" 1 "), std::string::npos) << a;
  EXPECT_NE(a.find("device_bytes=256MiB contexts=8"), std::string::npos) << a;
  EXPECT_NE(ops.find("admin"), std::string::npos) << ops;
  EXPECT_NE(ops.find(" 2 "), std::string::npos) << ops;

  Result j = List(/*json=*/true);
  ASSERT_EQ(j.code, 0);
  EXPECT_NE(j.out.find("\"name\": \"ops\", \"role\": \"admin\", \"tokens\": 2"), std::string::npos)
      << j.out;
  EXPECT_NE(j.out.find("\"quotas\": {\"device_bytes\": \"256MiB\", \"contexts\": 8}"),
            std::string::npos)
      << j.out;

  toml::table root = Parsed();
  for (const toml::node& t : *root["tenants"].as_array()) {
    for (const toml::node& h : *t.as_table()->get("token_sha256")->as_array()) {
      const std::string hash = *h.value<std::string>();
      EXPECT_EQ(r.out.find(hash.substr(0, 16)), std::string::npos);
      EXPECT_EQ(j.out.find(hash.substr(0, 16)), std::string::npos);
    }
  }
}

TEST_F(TenantsTest, RotateAddsATokenAndRevokeOthersDropsTheOldOnes) {
  const std::string first = TokenOf(Add("engine-a").out);
  ASSERT_EQ(Add("engine-b").code, 0);
  Result r = Rotate("engine-a", /*revoke_others=*/false);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string second = TokenOf(r.out);
  EXPECT_NE(first, second);
  {
    toml::table root = Parsed();
    const toml::array& hashes = *root["tenants"][0]["token_sha256"].as_array();
    ASSERT_EQ(hashes.size(), 2u);
    EXPECT_EQ(hashes[0].value<std::string>(), auth::HashToken(first));
    EXPECT_EQ(hashes[1].value<std::string>(), auth::HashToken(second));
    EXPECT_EQ(root["tenants"][1]["name"].value<std::string>(), "engine-b");
  }
  r = Rotate("engine-a", /*revoke_others=*/true);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string third = TokenOf(r.out);
  EXPECT_NE(r.err.find("revoked 2 other token(s)"), std::string::npos) << r.err;
  toml::table root = Parsed();
  const toml::array& hashes = *root["tenants"][0]["token_sha256"].as_array();
  ASSERT_EQ(hashes.size(), 1u);
  EXPECT_EQ(hashes[0].value<std::string>(), auth::HashToken(third));
  EXPECT_EQ(root["tenants"][1]["token_sha256"].as_array()->size(), 1u) << "engine-b untouched";
  EXPECT_EQ(FileMode(), 0600);
}

TEST_F(TenantsTest, RotateOfAnUnknownTenantIsAUsageError) {
  ASSERT_EQ(Add("engine-a").code, 0);
  Result r = Rotate("engine-z", false);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("\"engine-z\" is not in"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST_F(TenantsTest, RewriteDropsPermissionsForOthers) {
  ASSERT_EQ(Add("engine-a").code, 0);
  ASSERT_EQ(chmod(file_.c_str(), 0644), 0);
  ASSERT_EQ(Rotate("engine-a", false).code, 0);
  EXPECT_EQ(FileMode(), 0640);
}

TEST_F(TenantsTest, AnInvalidExistingFileIsNotTouched) {
  {
    std::ofstream out(file_);
    out << "[[tenants]]\nname = \"a\"\ntoken_sha256 = [\"" << auth::HashToken("x")
        << "\"]\nflavour = \"x\"\n";
  }
  const std::string before = FileText();
  Result r = Add("b");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(file_ + ": tenants[0]: unknown key 'flavour'"), std::string::npos) << r.err;
  EXPECT_EQ(FileText(), before);
  EXPECT_EQ(List().code, 1);
  EXPECT_EQ(Rotate("a", false).code, 1);
}

TEST_F(TenantsTest, ListOfAMissingFileFails) {
  Result r = List();
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(file_), std::string::npos) << r.err;
}

TEST(TenantsFileTest, ParseQuotaArgument) {
  auto q = ParseQuotaArgument("device_bytes = 64 MiB");
  ASSERT_OK(q) << q.status();
  EXPECT_EQ(q->value, "64 MiB");
  EXPECT_TRUE(q->is_size_string);
  q = ParseQuotaArgument("profiles=16");
  ASSERT_OK(q);
  EXPECT_FALSE(q->is_size_string);
  EXPECT_FALSE(ParseQuotaArgument("profiles").ok());
  EXPECT_FALSE(ParseQuotaArgument("nvme_bytes=-1").ok());
  EXPECT_FALSE(ParseQuotaArgument("nvme_bytes=99999999999TiB").ok()) << "overflows 64 bits";
  EXPECT_FALSE(ParseQuotaArgument("nvme_bytes=9223372036854775808").ok()) << "over int64";
  EXPECT_OK(ParseQuotaArgument("nvme_bytes=9223372036854775807"));
}

TEST(TenantsFileTest, FormattedFileParsesBackEqual) {
  TenantEntry t;
  t.name = "x";
  t.role = "admin";
  t.token_sha256 = {auth::HashToken("1"), auth::HashToken("2")};
  t.cert_names = {"back\\slash", "tab\there"};
  t.quotas = {{"pinned_bytes", "1GiB", true}, {"contexts", "3", false}};
  auto back = ParseTenants(FormatTenantsFile({t}), "mem");
  ASSERT_OK(back) << back.status();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0], t);
}

TEST(TenantsFileTest, TheDaemonsRulesApply) {
  const std::string h = auth::HashToken("t");
  EXPECT_NE(ParseTenants("[[tenants]]\nname = \"a\"\n", "f")
                .status()
                .message()
                .find("needs token_sha256, cert_names or uids"),
            std::string::npos);
  EXPECT_NE(ParseTenants("[[tenants]]\nname = \"a\"\ntoken_sha256 = [\"ABC\"]\n", "f")
                .status()
                .message()
                .find("64 lowercase hex"),
            std::string::npos);
  const std::string two = "[[tenants]]\nname = \"a\"\ntoken_sha256 = [\"" + h +
                          "\"]\n[[tenants]]\nname = \"b\"\ntoken_sha256 = [\"" + h + "\"]\n";
  EXPECT_NE(ParseTenants(two, "f").status().message().find("f: tenants[1]: a token hash"),
            std::string::npos);
  EXPECT_NE(ParseTenants("other = 1\n", "f").status().message().find("unknown key 'other'"),
            std::string::npos);
}

TEST(ResolveTokenTest, FlagThenFileThenEnvironment) {
  const ::kvtier::testing::ScopedTempDir tmp("token");
  const std::string& dir = tmp.path();
  const std::string file = dir + "/token";
  {
    std::ofstream out(file);
    out << "  from-file\n";
  }
  EXPECT_EQ(*ResolveToken("from-flag", "", "from-env"), "from-flag");
  EXPECT_EQ(*ResolveToken("", file, "from-env"), "from-file");
  EXPECT_EQ(*ResolveToken("", "", "from-env"), "from-env");
  EXPECT_EQ(*ResolveToken("", "", ""), "");
  EXPECT_EQ(*ResolveToken("", "", nullptr), "");
  EXPECT_THAT(ResolveToken("a", file, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ResolveToken("", dir + "/missing", nullptr).status(),
              StatusIs(absl::StatusCode::kNotFound));
  {
    std::ofstream out(file);
    out << "\n\n";
  }
  EXPECT_NE(ResolveToken("", file, nullptr).status().message().find("empty"), std::string::npos);
  {
    std::ofstream out(file);
    out << "one\ntwo\n";
  }
  EXPECT_NE(ResolveToken("", file, nullptr).status().message().find("more than one line"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::ctl
