from bench.soak.runner import main

if __name__ == "__main__":
    main()
