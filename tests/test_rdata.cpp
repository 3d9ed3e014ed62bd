// test_rdata.cpp: the R lazy-load database reader of the fine-tuning example
// (examples/finetune/rdata.h). Without any download it reads the hand-made databases and .rds
// files of tests/data/rdata (written by scripts/make_reference.py in R's exact layout), two
// small files written by R itself (janeaustenr's Rdata.rdx/Rdata.rds index), and corrupted
// copies that must throw taper::Error. With scripts/fetch_data.sh run, it also reads the six
// novels of Debian's r-cran-janeaustenr.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "examples/finetune/rdata.h"
#include "taper/error.h"

namespace {

namespace fs = std::filesystem;
using taper::finetune::LazyLoadDb;
using taper::finetune::RType;
using taper::finetune::RValue;

fs::path data_dir() { return fs::path(__FILE__).parent_path() / "data" / "rdata"; }

fs::path janeaustenr_dir() {
  if (const char* env = std::getenv("TAPER_JANEAUSTENR_DIR")) return env;
  return fs::path(__FILE__).parent_path().parent_path() /
         ".data/janeaustenr/usr/lib/R/site-library/janeaustenr/data";
}

// A fresh scratch folder per test, removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("taper_rdata_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Expects `fn` to throw taper::Error whose message contains `needle`.
template <class F>
void expect_error(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no taper::Error thrown (expected one mentioning '" << needle << "')";
  } catch (const taper::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RData, ReadsEveryTypeOfTheHandMadeDatabase) {
  LazyLoadDb db(data_dir());
  EXPECT_EQ(db.names(), (std::vector<std::string>{"flags", "ints", "lines", "nested", "pairs", "reals", "seq", "text"}));
  EXPECT_TRUE(db.contains("text"));
  EXPECT_FALSE(db.contains("emma"));

  const RValue text = db.get("text");
  ASSERT_EQ(text.type, RType::Str);
  ASSERT_EQ(text.strings.size(), 5u);
  EXPECT_EQ(*text.strings[0], "Hello");
  EXPECT_EQ(*text.strings[1], "");
  EXPECT_EQ(*text.strings[2], "na\xc3\xafve caf\xc3\xa9");  // UTF-8 as stored
  EXPECT_EQ(*text.strings[3], "caf\xc3\xa9");               // Latin-1 converted to UTF-8
  EXPECT_FALSE(text.strings[4].has_value());                // NA_STRING
  EXPECT_EQ(db.get_strings("text")[4], "");

  const RValue ints = db.get("ints");
  ASSERT_EQ(ints.type, RType::Int);
  EXPECT_EQ(ints.ints, (std::vector<int32_t>{1, -2, taper::finetune::kRNaInt, 2147483647}));
  EXPECT_EQ(ints.names(), (std::vector<std::string>{"a", "b", "c", "d"}));

  const RValue reals = db.get("reals");
  ASSERT_EQ(reals.type, RType::Real);
  ASSERT_EQ(reals.reals.size(), 3u);
  EXPECT_EQ(reals.reals[0], 0.5);
  EXPECT_EQ(reals.reals[1], -1e300);
  EXPECT_TRUE(std::isinf(reals.reals[2]) && reals.reals[2] > 0);

  const RValue flags = db.get("flags");
  ASSERT_EQ(flags.type, RType::Lgl);
  EXPECT_EQ(flags.ints, (std::vector<int32_t>{1, 0, taper::finetune::kRNaInt}));

  const RValue nested = db.get("nested");
  ASSERT_EQ(nested.type, RType::Vec);
  EXPECT_EQ(nested.names(), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(*nested.at("first").strings.at(0), "x");
  EXPECT_EQ(nested.at("second").ints, std::vector<int32_t>{7});
  ASSERT_NE(nested.attr("class"), nullptr);
  EXPECT_EQ(*nested.attr("class")->strings.at(0), "myclass");
  EXPECT_THROW(nested.at("third"), taper::Error);

  const RValue seq = db.get("seq");  // ALTREP compact_intseq 10:14
  ASSERT_EQ(seq.type, RType::Int);
  EXPECT_EQ(seq.ints, (std::vector<int32_t>{10, 11, 12, 13, 14}));

  const RValue pairs = db.get("pairs");
  ASSERT_EQ(pairs.type, RType::List);
  EXPECT_EQ(pairs.tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(pairs.at("a").ints, std::vector<int32_t>{1});
  EXPECT_EQ(*pairs.at("b").strings.at(0), "two");

  const std::vector<std::string> lines = db.get_strings("lines");
  ASSERT_EQ(lines.size(), 1000u);
  EXPECT_EQ(lines.front(), "line 0");
  EXPECT_EQ(lines[517], "line 517");
  EXPECT_EQ(lines.back(), "line 999");

  expect_error([&] { db.get_strings("ints"); }, "INTSXP, not a character vector");
  expect_error([&] { db.get("emma"); }, "has no variable 'emma'");
}

TEST(RData, OpensByPrefixOrFileName) {
  EXPECT_EQ(LazyLoadDb(data_dir() / "Rdata").names().size(), 8u);
  EXPECT_EQ(LazyLoadDb(data_dir() / "Rdata.rdx").names().size(), 8u);
  EXPECT_EQ(LazyLoadDb(data_dir() / "Rdata.rdb").get_strings("lines").size(), 1000u);
}

TEST(RData, TypedCompressionStoredZlibAndRefusedXz) {
  LazyLoadDb db(data_dir() / "typed");
  EXPECT_EQ(db.get_strings("lines").size(), 1000u);                                  // 'Z'
  EXPECT_EQ(db.get("seq").ints, (std::vector<int32_t>{10, 11, 12, 13, 14}));         // '0'
  EXPECT_EQ(db.get("flags").ints, (std::vector<int32_t>{1, 0, taper::finetune::kRNaInt}));
  expect_error([&] { db.get("reals"); }, "xz compression");
}

TEST(RData, ReadsRdsFiles) {
  const RValue nested = taper::finetune::read_rds(data_dir() / "nested.rds");
  EXPECT_EQ(nested.names(), (std::vector<std::string>{"first", "second"}));
  expect_error([] { taper::finetune::read_rds(data_dir() / "corrupt.rds"); }, "corrupt.rds");
  expect_error([] { taper::finetune::read_rds(data_dir() / "no_such.rds"); }, "cannot open");
}

// Files written by R 4.2 (janeaustenr's index, 262 bytes, and its Rdata.rds): the reader agrees
// with R's own writer, not only with our hand-made fixtures.
TEST(RData, ReadsIndexWrittenByR) {
  const RValue index = taper::finetune::read_rds(data_dir() / "janeaustenr_Rdata.rdx");
  ASSERT_EQ(index.type, RType::Vec);
  EXPECT_EQ(index.names(), (std::vector<std::string>{"variables", "references", "compressed"}));
  const RValue& vars = index.at("variables");
  EXPECT_EQ(vars.names(), (std::vector<std::string>{"emma", "mansfieldpark", "northangerabbey", "persuasion",
                                                    "prideprejudice", "sensesensibility"}));
  ASSERT_EQ(vars.items.size(), 6u);
  EXPECT_EQ(vars.items[0]->ints, (std::vector<int32_t>{0, 352043}));
  EXPECT_EQ(index.at("compressed").type, RType::Lgl);
  EXPECT_EQ(index.at("compressed").ints, std::vector<int32_t>{1});
  EXPECT_EQ(index.at("references").length(), 0u);

  const RValue rds = taper::finetune::read_rds(data_dir() / "janeaustenr_Rdata.rds");
  EXPECT_EQ(rds.names(), vars.names());
  EXPECT_EQ(*rds.at("persuasion").strings.at(0), "persuasion");
}

TEST(RData, CorruptDatabasesThrow) {
  ScratchDir dir("corrupt");
  const std::vector<uint8_t> rdx = taper::finetune::read_file_bytes(data_dir() / "Rdata.rdx");
  const std::vector<uint8_t> rdb = taper::finetune::read_file_bytes(data_dir() / "Rdata.rdb");
  const fs::path prefix = dir.path() / "Rdata";

  // Missing files: the message names the expected paths.
  expect_error([&] { LazyLoadDb db(dir.path()); }, "lazy-load database not found");

  // A truncated index.
  write_bytes(dir.path() / "Rdata.rdx", std::vector<uint8_t>(rdx.begin(), rdx.begin() + 40));
  write_bytes(dir.path() / "Rdata.rdb", rdb);
  expect_error([&] { LazyLoadDb db(prefix); }, "Rdata.rdx");

  // An index that is not compressed R data at all.
  write_bytes(dir.path() / "Rdata.rdx", std::vector<uint8_t>(64, 0x55));
  expect_error([&] { LazyLoadDb db(prefix); }, "neither gzip, zlib nor an XDR");

  // A good index over a damaged .rdb: every entry must fail cleanly, none may crash.
  write_bytes(dir.path() / "Rdata.rdx", rdx);
  std::vector<uint8_t> bad = rdb;
  for (size_t i = 8; i < bad.size(); i += 7) bad[i] ^= 0x5A;
  write_bytes(dir.path() / "Rdata.rdb", bad);
  LazyLoadDb db(prefix);
  for (const auto& name : db.names()) {
    SCOPED_TRACE(name);
    EXPECT_THROW(db.get(name), taper::Error);
  }

  // A .rdb cut short: entries past the end are reported with their offsets.
  write_bytes(dir.path() / "Rdata.rdb", std::vector<uint8_t>(rdb.begin(), rdb.begin() + 100));
  LazyLoadDb short_db(prefix);
  expect_error([&] { short_db.get("lines"); }, "lies outside the file");
}

// Malformed serialisations built in memory: each must throw, never read out of bounds.
TEST(RData, MalformedStreamsThrow) {
  using taper::finetune::unserialize;
  auto be = [](std::vector<uint8_t>& v, int32_t x) {
    for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(static_cast<uint32_t>(x) >> s));
  };
  auto header = [&](int version) {
    std::vector<uint8_t> v = {'X', '\n'};
    be(v, version);
    be(v, 0x040201);
    be(v, 0x030500);
    if (version == 3) {
      be(v, 5);
      for (char c : std::string("UTF-8")) v.push_back(static_cast<uint8_t>(c));
    }
    return v;
  };
  std::vector<uint8_t> ok = header(3);
  be(ok, 13);  // INTSXP of length 2
  be(ok, 2);
  be(ok, 5);
  be(ok, 6);
  EXPECT_EQ(unserialize(ok).ints, (std::vector<int32_t>{5, 6}));
  std::vector<uint8_t> v2 = header(2);
  v2.insert(v2.end(), ok.begin() + static_cast<long>(header(3).size()), ok.end());
  EXPECT_EQ(unserialize(v2).ints, (std::vector<int32_t>{5, 6}));

  for (size_t cut = 0; cut < ok.size(); ++cut) {  // every truncation
    EXPECT_THROW(unserialize(std::span(ok).first(cut)), taper::Error) << "cut at " << cut;
  }
  expect_error([&] { std::vector<uint8_t> a = {'A', '\n', '3'}; unserialize(a); }, "ASCII");
  expect_error([&] { unserialize(header(4)); }, "version 4");

  std::vector<uint8_t> huge = header(3);  // a long vector claiming 2^40 elements
  be(huge, 16);
  be(huge, -1);
  be(huge, 256);
  be(huge, 0);
  expect_error([&] { unserialize(huge); }, "exceeds the input size");

  std::vector<uint8_t> env = header(3);  // an environment
  be(env, 4);
  expect_error([&] { unserialize(env); }, "ENVSXP");

  std::vector<uint8_t> ref = header(3);  // a reference to nothing
  be(ref, (3 << 8) | 255);
  expect_error([&] { unserialize(ref); }, "unknown object");

  std::vector<uint8_t> deep = header(3);  // a list nested 10^5 deep
  for (int i = 0; i < 100000; ++i) {
    be(deep, 19);
    be(deep, 1);
  }
  expect_error([&] { unserialize(deep); }, "nested too deeply");
}

// The six novels of Debian's r-cran-janeaustenr, when scripts/fetch_data.sh has fetched them.
TEST(RData, ReadsTheSixNovels) {
  const fs::path dir = janeaustenr_dir();
  if (!fs::exists(dir / "Rdata.rdx")) {
    GTEST_SKIP() << "janeaustenr data not found in " << dir << ": run `bash scripts/fetch_data.sh`";
  }
  LazyLoadDb db(dir);
  struct Novel {
    const char* name;
    size_t lines;
    const char* first;
  };
  const Novel novels[] = {{"emma", 16235, "EMMA"},
                          {"mansfieldpark", 15349, "MANSFIELD PARK"},
                          {"northangerabbey", 7856, "NORTHANGER ABBEY"},
                          {"persuasion", 8328, "Persuasion"},
                          {"prideprejudice", 13030, "PRIDE AND PREJUDICE"},
                          {"sensesensibility", 12624, "SENSE AND SENSIBILITY"}};
  ASSERT_EQ(db.names().size(), 6u);
  for (const Novel& n : novels) {
    SCOPED_TRACE(n.name);
    const std::vector<std::string> text = db.get_strings(n.name);
    EXPECT_EQ(text.size(), n.lines);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.front(), n.first);
    size_t chars = 0;
    for (const auto& line : text) chars += line.size();
    EXPECT_GT(chars, 400000u);
  }
  const std::vector<std::string> pp = db.get_strings("prideprejudice");
  bool found = false;
  for (const auto& line : pp) found = found || line.find("It is a truth universally acknowledged") != std::string::npos;
  EXPECT_TRUE(found);
}

}  // namespace
